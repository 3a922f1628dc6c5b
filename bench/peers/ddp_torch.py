#!/usr/bin/python3
"""PyTorch peer for bench/data_parallel: DistributedDataParallel over Gloo
(what a PyTorch user runs on CPUs) with the model of docs/baselines.md,
8 x (Linear(1024, 1024) + ReLU), MSE loss, SGD(lr=0.05), per-replica batch
256, one compute thread per process, bucket_cap_mb as troupe's.

  /usr/bin/python3 bench/peers/ddp_torch.py --replicas 2 --steps 6 [--bucket-mib 25] [--model mlp|gpt]

--model gpt: gpt_step_torch.py's GPT (bench/gpt_step's "gpt" size: 6 blocks,
width 256, sequence 128), per-replica batch 16 (one fixed batch per replica
from seed 7 + rank), cross entropy, AdamW(lr 3e-3, weight decay 0.01).

Prints one JSON line: {"replicas": R, "step_seconds": [...rank 0's steps...],
"samples_per_s": R * batch / median step, "identical": true|false, "loss": L}
where "identical" says whether every replica ended with bitwise equal
parameters and L is rank 0's last loss.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_step_torch  # noqa: E402  (the GPT of --model gpt)

DIM, LAYERS, BATCH, LR, WARMUP = 1024, 8, 256, 0.05, 2


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mlp(rank):
    """The MLP, its SGD, loss and this replica's batch."""
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(DIM, DIM), nn.ReLU()]
    gen = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(BATCH, DIM, generator=gen)
    y = torch.randn(BATCH, DIM, generator=gen)
    return nn.Sequential(*layers), lambda p: torch.optim.SGD(p, lr=LR), nn.functional.mse_loss, x, y


def gpt(rank):
    """The GPT (seed 1), its AdamW, loss and this replica's batch."""
    size = gpt_step_torch.GPT
    torch.manual_seed(1)
    model = gpt_step_torch.Gpt(size["vocabulary"], size["width"], size["heads"], size["blocks"], size["sequence"])
    ids, targets = gpt_step_torch.gpt_data(7 + rank)
    adamw = lambda p: torch.optim.AdamW(p, lr=size["lr"], weight_decay=size["weight_decay"])
    return model, adamw, gpt_step_torch.gpt_loss, ids, targets


def replica(rank, world, port, steps, bucket_mib, model_name, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    module, optimizer, loss_fn, x, y = (gpt if model_name == "gpt" else mlp)(rank)
    model = DDP(module, bucket_cap_mb=bucket_mib)
    opt = optimizer(model.parameters())
    times = []
    for step in range(WARMUP + steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        results.put({"step_seconds": times, "identical": all(torch.equal(g, flat) for g in gathered),
                     "loss": loss.item()})
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bucket-mib", type=float, default=25)
    parser.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=replica, args=(r, args.replicas, port, args.steps, args.bucket_mib, args.model, results))
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
    batch = gpt_step_torch.GPT["batch"] if args.model == "gpt" else BATCH
    print(json.dumps({"replicas": args.replicas, "step_seconds": got["step_seconds"],
                      "samples_per_s": args.replicas * batch / median, "identical": got["identical"],
                      "loss": got["loss"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
