#!/usr/bin/python3
"""PyTorch peer for bench/tensor_parallel: a GPT transformer block (layer
norm, causal self-attention, layer norm, MLP of 4 x width with GELU;
residuals), float32, with its heads and hidden features split over `degree`
processes as Megatron-LM writes it in plain PyTorch 1.13 (no
torch.distributed.tensor.parallel there): column-parallel q/k/v and first
MLP layer (input copied, its gradient all-reduced), row-parallel output
projection and second MLP layer (partial outputs all-reduced, bias added
once), torch.distributed.all_reduce over Gloo, one compute thread per
process. Forward + backward of mean(y * y), as the troupe side.

  /usr/bin/python3 bench/peers/tensor_parallel_torch.py --degree 2 --steps 5 [--width 2048] [--heads 16]
                                                         [--seq 256] [--batch 8]

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


def uniform(shape, fan_in):
    bound = fan_in ** -0.5
    return torch.empty(*shape).uniform_(-bound, bound)


def rank_main(rank, degree, port, args, results):
    torch.set_num_threads(1)
    if degree > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=degree)
    width, heads, hidden = args.width, args.heads, 4 * args.width
    head_size = width // heads
    h_off, h_size = split(heads, degree, rank)
    cols = slice(h_off * head_size, (h_off + h_size) * head_size)
    m_off, m_size = split(hidden, degree, rank)
    torch.manual_seed(7)  # every rank draws the whole layers, keeps its piece
    attn_w, attn_b = uniform((3 * width, width), width), uniform((3 * width,), width)
    rows = torch.cat([torch.arange(part * width, (part + 1) * width)[cols] for part in range(3)])
    params = {
        "attn_w": attn_w[rows], "attn_b": attn_b[rows],
        "proj_w": uniform((width, width), width)[:, cols], "proj_b": uniform((width,), width),
        "fc_w": uniform((hidden, width), width)[m_off:m_off + m_size],
        "fc_b": uniform((hidden,), width)[m_off:m_off + m_size],
        "out_w": uniform((width, hidden), hidden)[:, m_off:m_off + m_size], "out_b": uniform((width,), hidden),
        "ln1_w": torch.ones(width), "ln1_b": torch.zeros(width),
        "ln2_w": torch.ones(width), "ln2_b": torch.zeros(width),
    }
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    copy = CopyToGroup.apply if degree > 1 else (lambda t: t)
    reduce = ReduceFromGroup.apply if degree > 1 else (lambda t: t)
    mask = torch.full((args.seq, args.seq), float("-inf")).triu(1)
    x = torch.randn(args.batch, args.seq, width, generator=torch.Generator().manual_seed(11))

    def block(x):
        b, s = x.shape[0], x.shape[1]
        qkv = F.linear(copy(F.layer_norm(x, (width,), p["ln1_w"], p["ln1_b"])), p["attn_w"], p["attn_b"])
        q, k, v = (t.reshape(b, s, h_size, head_size).transpose(1, 2) for t in qkv.split(h_size * head_size, 2))
        weights = torch.softmax(q @ k.transpose(-2, -1) * head_size ** -0.5 + mask, -1)
        y = (weights @ v).transpose(1, 2).reshape(b, s, h_size * head_size)
        x = x + reduce(F.linear(y, p["proj_w"])) + p["proj_b"]
        h = F.gelu(F.linear(copy(F.layer_norm(x, (width,), p["ln2_w"], p["ln2_b"])), p["fc_w"], p["fc_b"]))
        return x + reduce(F.linear(h, p["out_w"])) + p["out_b"]

    times, loss = [], None
    for step in range(WARMUP + args.steps):
        for t in p.values():
            t.grad = None
        if degree > 1:
            dist.barrier()
        start = time.perf_counter()
        y = block(x)
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
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
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
