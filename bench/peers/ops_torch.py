#!/usr/bin/python3
"""PyTorch peer for bench/ops: the same ops at the same shapes, forward and
backward through autograd, one thread. Commands on stdin: "case K" makes
case K (bench/ops.cpp's order) current and runs it once; "steps N" times N
runs of it and answers {"step_seconds": [...]}; "quit" or EOF ends it.
"""
import json
import os
import sys
import time

for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = "1"

import torch
import torch.nn as nn
import torch.nn.functional as F
from gpt_step_torch import Attention

BATCH, SEQUENCE, WIDTH, HEADS, VOCABULARY = 16, 128, 256, 8, 86
TOKENS = BATCH * SEQUENCE


def forward_backward(x, f, upstream):
    x = x.detach().requires_grad_(True)
    f(x).backward(upstream)
    return x.grad


def make_cases():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(TOKENS, 4 * WIDTH, generator=g)
    scores = torch.randn(BATCH * HEADS, SEQUENCE, SEQUENCE, generator=g)
    activations = torch.randn(BATCH, SEQUENCE, WIDTH, generator=g)
    logits = torch.randn(TOKENS, VOCABULARY, generator=g)
    targets = torch.randint(0, VOCABULARY, (TOKENS,), generator=g)
    ids = torch.randint(0, VOCABULARY, (BATCH, SEQUENCE), generator=g)
    norm = nn.LayerNorm(WIDTH)
    attention = Attention(WIDTH, HEADS)
    attention_dropout = Attention(WIDTH, HEADS, dropout=0.1)
    table = nn.Embedding(VOCABULARY, WIDTH)
    parameter = nn.Parameter(torch.randn(4_800_000, generator=g))
    parameter.grad = torch.randn(4_800_000, generator=g)
    adamw = torch.optim.AdamW([parameter], lr=1e-3, weight_decay=0.01)

    def embedding():
        table.zero_grad(set_to_none=True)
        table(ids).backward(activations)

    return [
        lambda: forward_backward(hidden, F.gelu, hidden),
        lambda: forward_backward(hidden, lambda x: F.gelu(x, approximate="tanh"), hidden),
        lambda: forward_backward(scores, lambda x: F.softmax(x, -1), scores),
        lambda: forward_backward(activations, norm, activations),
        lambda: forward_backward(activations, attention, activations),
        lambda: forward_backward(activations, attention_dropout, activations),
        lambda: forward_backward(logits, lambda x: F.cross_entropy(x, targets), torch.tensor(1.0)),
        embedding,
        lambda: forward_backward(hidden, lambda x: F.dropout(x, 0.1, training=True), hidden),
        lambda: hidden.sum(0),
        lambda: hidden.to(torch.bfloat16).float(),
        adamw.step,
    ]


def main():
    torch.set_num_threads(1)
    torch.manual_seed(1)
    cases = make_cases()
    current = cases[0]
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if len(words) == 2 and words[0] == "case" and words[1].isdigit() and int(words[1]) < len(cases):
            current = cases[int(words[1])]
            current()
            print(json.dumps({"case": int(words[1])}), flush=True)
        elif len(words) == 2 and words[0] == "steps" and words[1].isdigit():
            times = []
            for _ in range(int(words[1])):
                t0 = time.perf_counter()
                current()
                times.append(time.perf_counter() - t0)
            print(json.dumps({"step_seconds": times}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)


if __name__ == "__main__":
    main()
