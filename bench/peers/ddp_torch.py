#!/usr/bin/python3
"""PyTorch peer for bench/data_parallel: DistributedDataParallel over Gloo
(what a PyTorch user runs on CPUs) with the model of docs/baselines.md,
8 x (Linear(1024, 1024) + ReLU), MSE loss, SGD(lr=0.05), per-replica batch
256, one compute thread per process, bucket_cap_mb as troupe's.

  /usr/bin/python3 bench/peers/ddp_torch.py --replicas 2 --steps 6 [--bucket-mib 25]

Prints one JSON line: {"replicas": R, "step_seconds": [...rank 0's steps...],
"samples_per_s": R * batch / median step, "identical": true|false} where
"identical" says whether every replica ended with bitwise equal parameters.
Stays on 127.0.0.1 and stops by itself.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = "1"
os.environ["GLOO_SOCKET_IFNAME"] = "lo"

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

DIM, LAYERS, BATCH, LR, WARMUP = 1024, 8, 256, 0.05, 2


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica(rank, world, port, steps, bucket_mib, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(DIM, DIM), nn.ReLU()]
    model = DDP(nn.Sequential(*layers), bucket_cap_mb=bucket_mib)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(BATCH, DIM, generator=gen)
    y = torch.randn(BATCH, DIM, generator=gen)
    times = []
    for step in range(WARMUP + steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        results.put({"step_seconds": times, "identical": all(torch.equal(g, flat) for g in gathered)})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bucket-mib", type=float, default=25)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=replica, args=(r, args.replicas, port, args.steps, args.bucket_mib, results))
             for r in range(args.replicas)]
    for p in procs:
        p.start()
    deadline = time.time() + 300
    for p in procs:
        p.join(max(1, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if results.empty():
        print(json.dumps({"replicas": args.replicas, "error": "a replica failed"}))
        return 1
    got = results.get()
    median = statistics.median(got["step_seconds"])
    print(json.dumps({"replicas": args.replicas, "step_seconds": got["step_seconds"],
                      "samples_per_s": args.replicas * BATCH / median, "identical": got["identical"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
