#!/usr/bin/python3
"""PyTorch peer for bench/mlp_step: the same model, batch, loss and optimizer
as troupe's side, in one process with one thread (the "local" mode of
../shared/peers/rpc_pipeline.py).

It runs as a server so the C++ benchmark can interleave rounds with its own
(the machine's speed drifts within seconds): each line "steps N" on stdin
runs N timed training steps and answers one JSON line
{"step_seconds": [...], "loss": L}; "quit" or EOF ends it.
"""
import json
import os
import sys

for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = "1"

import time

import torch
import torch.nn as nn

DIM, LAYERS, BATCH, LR = 1024, 8, 256, 0.05


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(DIM, DIM), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(BATCH, DIM, generator=g)
    y = torch.randn(BATCH, DIM, generator=g)
    loss_fn = nn.MSELoss()
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] != "steps" or len(words) != 2 or not words[1].isdigit():
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
            continue
        times, loss = [], float("nan")
        for _ in range(int(words[1])):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = loss_fn(model(x), y)
            out.backward()
            opt.step()
            loss = out.item()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"step_seconds": times, "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
