#!/usr/bin/python3
"""PyTorch peer for bench/elementwise: the same ops on the same sizes with
one thread. Each line "OP SCALE" (OP: gelu, gelu_backward, exp, tanh,
sigmoid) times the op on float32 inputs drawn from N(0, SCALE) and answers
{"seconds": median seconds per call}; "quit" or EOF ends it.
"""
import json
import os
import sys
import time

for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = "1"

import torch
import torch.nn.functional as F


def time_per_call(fn, seconds=0.1):
    fn()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def main():
    torch.set_num_threads(1)
    n = int(sys.argv[1])
    print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if len(words) != 2:
            print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
            continue
        op, scale = words[0], float(words[1])
        g = torch.Generator().manual_seed(11)
        x = torch.randn(n, generator=g) * scale
        grad = torch.randn(n, generator=g)
        ops = {
            "gelu": lambda: F.gelu(x),
            "gelu_backward": lambda: torch.ops.aten.gelu_backward(grad, x),
            "exp": lambda: torch.exp(x),
            "tanh": lambda: torch.tanh(x),
            "sigmoid": lambda: torch.sigmoid(x),
        }
        if op not in ops:
            print(json.dumps({"error": f"unknown op {op!r}"}), flush=True)
            continue
        print(json.dumps({"seconds": time_per_call(ops[op])}), flush=True)


if __name__ == "__main__":
    main()
