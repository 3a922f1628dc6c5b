#!/usr/bin/python3
"""PyTorch peer for bench/gpt_step: troupe's GPT (autograd/src/nn/gpt.cpp:
token and position embeddings, pre-norm blocks of causal self-attention and
a 4x exact-GELU MLP, final LayerNorm, a bias-free head), trained with AdamW
(weight decay 0.01, the learning rate it is given) in float32, as troupe's side: on cuda:0 with
TF32 off, or on the CPU with the threads troupe's side has (one by default).

Arguments: vocabulary width heads blocks sequence batch device (cpu or
cuda:0) [learning rate, default 3e-3] [threads, default 1]. It runs as a server so the C++ benchmark can interleave rounds with
its own: step_server.py's protocol.

rpc_pipeline.py and ddp_torch.py import the model from here (Gpt, GptSlice,
GPT: bench/gpt_step's "gpt" size); an importer sets the thread count itself.
"""
import math
import os
import sys

THREADS = 1
if __name__ == "__main__":  # before torch's import, which reads them
    THREADS = int(sys.argv[9]) if len(sys.argv) > 9 else 1
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[key] = str(THREADS)

import torch
import torch.nn as nn
import torch.nn.functional as F

# bench/gpt_step's "gpt" size (bench/models.hpp), the GPT of the distributed
# peers: AdamW with this lr and weight decay, cross entropy from the logits.
GPT = {"vocabulary": 86, "width": 256, "heads": 8, "blocks": 6, "sequence": 128, "batch": 16,
       "lr": 3e-3, "weight_decay": 0.01}


class Attention(nn.Module):
    def __init__(self, width, heads, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.dropout = dropout  # on the weights and the output, as troupe's attention_options
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        mask = torch.triu(torch.full((t, t), float("-inf"), device=x.device), diagonal=1)
        weights = F.softmax(scores + mask, dim=-1)
        if self.dropout > 0:
            weights = F.dropout(weights, self.dropout, self.training)
        y = self.c_proj((weights @ v).transpose(1, 2).reshape(b, t, c))
        return F.dropout(y, self.dropout, self.training) if self.dropout > 0 else y


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


class GptSlice(nn.Module):
    """Layers [begin, end) of `gpt` cut as troupe's nn::gpt is a sequential:
    layer 0 the embeddings, 1..blocks the blocks, blocks + 1 the final
    LayerNorm and head; it shares `gpt`'s modules. A slice that starts at 0
    takes token ids, one that ends after the head returns logits."""

    def __init__(self, gpt, begin, end):
        super().__init__()
        n = len(gpt.blocks)
        self.embed = gpt.wte if begin == 0 else None
        self.positions = gpt.wpe if begin == 0 else None
        self.blocks = nn.Sequential(*gpt.blocks[max(begin, 1) - 1:min(end, n + 1) - 1])
        self.ln_f = gpt.ln_f if end == n + 2 else None
        self.lm_head = gpt.lm_head if end == n + 2 else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        x = self.blocks(x)
        return self.lm_head(self.ln_f(x)) if self.lm_head is not None else x


def gpt_half(half, size=GPT):
    """Half `half` (0 or 1) of the GPT of `size` built from seed 1 (the same
    parameters in every process): troupe's even split of its blocks + 2
    layers, the embeddings and 3 blocks, then 3 blocks and the head."""
    torch.manual_seed(1)
    gpt = Gpt(size["vocabulary"], size["width"], size["heads"], size["blocks"], size["sequence"])
    layers = size["blocks"] + 2
    return GptSlice(gpt, 0, layers // 2) if half == 0 else GptSlice(gpt, layers // 2, layers)


def gpt_data(seed, size=GPT):
    """One fixed batch: token ids and next-token targets, both [batch, sequence]."""
    g = torch.Generator().manual_seed(seed)
    shape = (size["batch"], size["sequence"])
    return torch.randint(0, size["vocabulary"], shape, generator=g), torch.randint(0, size["vocabulary"], shape, generator=g)


def gpt_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    from step_server import serve_steps, training_device

    vocabulary, width, heads, blocks, sequence, batch = (int(a) for a in sys.argv[1:7])
    device = training_device(sys.argv[7] if len(sys.argv) > 7 else "cpu")
    if device is None:
        return
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
