#!/usr/bin/python3
"""PyTorch peer for bench/tensor_parallel: a transformer block's MLP,
Linear(width, 4 width) -> GELU -> Linear(4 width, width), float32, with its
hidden features split over `degree` processes as Megatron-LM writes it in
plain PyTorch 1.13 (no torch.distributed.tensor.parallel there):
column-parallel first layer (input copied, its gradient all-reduced),
row-parallel second layer (partial outputs all-reduced, bias added once),
torch.distributed.all_reduce over Gloo, one compute thread per process.
Forward + backward of mean(y * y), as the troupe side.

  /usr/bin/python3 bench/peers/tensor_parallel_torch.py --degree 2 --steps 5 [--width 2048] [--tokens 2048]

Prints one JSON line: {"degree": k, "step_seconds": [...rank 0's...],
"median_step_seconds": m, "loss": rank 0's last loss}. Stays on 127.0.0.1
and stops by itself.
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
import torch.nn.functional as F

WARMUP = 1


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CopyToGroup(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def split(total, degree, rank):
    base, extra = divmod(total, degree)
    offset = rank * base + min(rank, extra)
    return offset, base + (1 if rank < extra else 0)


def rank_main(rank, degree, port, args, results):
    torch.set_num_threads(1)
    if degree > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=degree)
    width, hidden = args.width, 4 * args.width
    torch.manual_seed(7)  # every rank draws the whole layers, keeps its piece
    fc_w = torch.empty(hidden, width).uniform_(-width ** -0.5, width ** -0.5)
    fc_b = torch.empty(hidden).uniform_(-width ** -0.5, width ** -0.5)
    proj_w = torch.empty(width, hidden).uniform_(-hidden ** -0.5, hidden ** -0.5)
    proj_b = torch.empty(width).uniform_(-hidden ** -0.5, hidden ** -0.5)
    off, size = split(hidden, degree, rank)
    fc_w = fc_w[off:off + size].clone().requires_grad_()
    fc_b = fc_b[off:off + size].clone().requires_grad_()
    proj_w = proj_w[:, off:off + size].clone().requires_grad_()
    proj_b = proj_b.clone().requires_grad_()
    x = torch.randn(args.tokens, width, generator=torch.Generator().manual_seed(11))
    times, loss = [], None
    for step in range(WARMUP + args.steps):
        for p in (fc_w, fc_b, proj_w, proj_b):
            p.grad = None
        if degree > 1:
            dist.barrier()
        start = time.perf_counter()
        h = F.gelu(F.linear(CopyToGroup.apply(x) if degree > 1 else x, fc_w, fc_b))
        partial = F.linear(h, proj_w)
        y = (ReduceFromGroup.apply(partial) if degree > 1 else partial) + proj_b
        loss = (y * y).mean()
        loss.backward()
        if step >= WARMUP:
            times.append(time.perf_counter() - start)
    if rank == 0:
        results.put({"step_seconds": times, "loss": loss.item()})
    if degree > 1:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--degree", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.degree, port, args, results)) for r in range(args.degree)]
    for p in procs:
        p.start()
    deadline = time.time() + 600
    for p in procs:
        p.join(max(1, deadline - time.time()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if results.empty():
        print(json.dumps({"degree": args.degree, "error": "a rank failed"}))
        return 1
    got = results.get()
    print(json.dumps({"degree": args.degree, "step_seconds": got["step_seconds"],
                      "median_step_seconds": statistics.median(got["step_seconds"]), "loss": got["loss"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
