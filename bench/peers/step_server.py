"""The command loop the training peers share (mlp_step_torch.py,
gpt_step_torch.py, cnn_step_torch.py), and their device set-up: once the model is built, print one "ready" line, then
answer each "steps N" on stdin with one JSON line
{"step_seconds": [...], "loss": L, "first_loss": F} after N timed training
steps; "quit" or EOF ends it. `step()` runs one step and returns its loss as
a float (reading it waits for the step's work, on a GPU too).
"""
import json
import sys
import time


def serve_steps(step, ready):
    print(json.dumps(dict(ready, ready=True)), flush=True)
    first = None
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
            loss = step()
            times.append(time.perf_counter() - t0)
            if first is None:
                first = loss
        print(json.dumps({"step_seconds": times, "loss": loss, "first_loss": first}), flush=True)


def training_device(name):
    """torch.device(name), with TF32 off on a GPU (troupe's side computes in
    full float32); None, having told the benchmark, when torch sees no CUDA
    device."""
    import torch

    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"error": "torch sees no CUDA device"}), flush=True)
            return None
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return device
