#!/usr/bin/python3
"""PyTorch peer for bench/gpt_step: troupe's GPT (autograd/src/nn/gpt.cpp:
token and position embeddings, pre-norm blocks of causal self-attention and
a 4x exact-GELU MLP, final LayerNorm, a bias-free head), trained with AdamW
(weight decay 0.01, the learning rate it is given) in float32, as troupe's side: on cuda:0 with
TF32 off, or on the CPU with the threads troupe's side has (one by default).

Arguments: vocabulary width heads blocks sequence batch device (cpu or
cuda:0) [learning rate, default 3e-3] [threads, default 1]. It runs as a server so the C++ benchmark can interleave rounds with
its own: step_server.py's protocol.
"""
import json
import math
import os
import sys

THREADS = int(sys.argv[9]) if len(sys.argv) > 9 else 1
for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[key] = str(THREADS)

import torch
import torch.nn as nn
import torch.nn.functional as F
from step_server import serve_steps


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.triu(torch.full((t, t), float("-inf"), device=x.device), diagonal=1)
        y = F.softmax(scores + mask, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocabulary, width, heads, blocks, sequence):
        super().__init__()
        self.wte = nn.Embedding(vocabulary, width)
        self.wpe = nn.Embedding(sequence, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocabulary, bias=False)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.lm_head(self.ln_f(self.blocks(self.wte(ids) + self.wpe(positions))))


def main():
    vocabulary, width, heads, blocks, sequence, batch = (int(a) for a in sys.argv[1:7])
    device = torch.device(sys.argv[7] if len(sys.argv) > 7 else "cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(json.dumps({"error": "torch sees no CUDA device"}), flush=True)
            return
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    lr = float(sys.argv[8]) if len(sys.argv) > 8 else 3e-3
    torch.set_num_threads(THREADS)
    torch.manual_seed(1)
    model = Gpt(vocabulary, width, heads, blocks, sequence).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator(device="cpu").manual_seed(7)
    ids = torch.randint(0, vocabulary, (batch, sequence), generator=g).to(device)
    targets = torch.randint(0, vocabulary, (batch * sequence,), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        out = F.cross_entropy(model(ids).view(-1, vocabulary), targets)
        out.backward()
        opt.step()
        return out.item()  # on a GPU, waits for the step's kernels, as troupe's side

    serve_steps(step, {"torch": torch.__version__})


if __name__ == "__main__":
    main()
