#!/usr/bin/python3
"""PyTorch peer for bench/mlp_step: the same model, batch, loss and optimizer
as troupe's side, in one process with one thread (the "local" mode of
bench/peers/rpc_pipeline.py).

It runs as a server so the C++ benchmark can interleave rounds with its own
(the machine's speed drifts within seconds): step_server.py's protocol.
"""
import os

for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = "1"

import torch
import torch.nn as nn
from step_server import serve_steps

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

    def step():
        opt.zero_grad(set_to_none=True)
        out = loss_fn(model(x), y)
        out.backward()
        opt.step()
        return out.item()

    serve_steps(step, {"torch": torch.__version__})


if __name__ == "__main__":
    main()
