#!/usr/bin/env python3
"""PyTorch CPU reference for bench/models.ts: GPT-2 small (124M, random weights; the
architecture of Hugging Face's GPT2LMHeadModel) timed for a forward on B×T tokens, a
training step (forward, cross-entropy, backward, AdamW) on the same batch, and one decoded
token with a KV cache after a T-token prompt. Prints one JSON object.

usage: python3 gpt2.py THREADS BATCH SEQ
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

threads, batch, seq = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(threads)
torch.manual_seed(0)
V, P, H, L, NH = 50257, 1024, 768, 12, 12


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.c_attn, self.c_proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.c_fc, self.mlp_proj = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x, cache=None):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(H, dim=2)
        q, k, v = (z.view(b, t, NH, H // NH).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            cache[:] = [k, v]
        w = q @ k.transpose(-1, -2) / math.sqrt(H // NH)
        tk = k.shape[2]
        mask = torch.ones(t, tk, dtype=torch.bool).tril(tk - t)
        w = w.masked_fill(~mask, float('-inf')).softmax(-1)
        y = (w @ v).transpose(1, 2).reshape(b, t, H)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(gelu_new(self.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(P, H)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(H)

    def forward(self, ids, caches=None, offset=0):
        pos = torch.arange(offset, offset + ids.shape[1])
        x = self.wte(ids) + self.wpe(pos)
        for i, blk in enumerate(self.h):
            x = blk(x, None if caches is None else caches[i])
        return self.ln_f(x) @ self.wte.weight.T


def median(times):
    times = sorted(times)
    return times[len(times) // 2]


model = GPT2()
ids = torch.randint(0, V, (batch, seq))
with torch.no_grad():
    model(ids)
    fwd = []
    for _ in range(3):
        t0 = time.perf_counter()
        model(ids)
        fwd.append(time.perf_counter() - t0)

opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def train_step():
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()


train_step()
steps = []
for _ in range(3):
    t0 = time.perf_counter()
    train_step()
    steps.append(time.perf_counter() - t0)

with torch.no_grad():
    caches = [[] for _ in range(L)]
    model(ids[:1], caches)
    tok = ids[:1, -1:]
    dec = []
    for i in range(16):
        t0 = time.perf_counter()
        logits = model(tok, caches, seq + i)
        tok = logits[:, -1:].argmax(-1)
        dec.append(time.perf_counter() - t0)

print(json.dumps({'forwardMs': 1000 * median(fwd), 'trainStepMs': 1000 * median(steps), 'decodeMs': 1000 * median(dec[2:]),
                  'threads': torch.get_num_threads(), 'torch': torch.__version__}))
