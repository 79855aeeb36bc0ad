#!/usr/bin/env python3
"""PyTorch CPU reference for bench/stack.ts: the same GPT-2-small-shaped stack of
LayerNorm → Linear(768→3072) → GELU(tanh) → Linear(3072→768) blocks with residuals, timed
for forward + backward + AdamW step. Prints one JSON object.

usage: python3 stack.py LAYERS TOKENS THREADS STEPS
"""
import json
import sys
import time

import torch

layers, tokens, threads, steps = (int(a) for a in sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(768)
        self.fc = torch.nn.Linear(768, 3072)
        self.proj = torch.nn.Linear(3072, 768)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln(x)), approximate='tanh'))


model = torch.nn.Sequential(*[Block() for _ in range(layers)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(tokens // 128, 128, 768)


def step():
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


step()
times = []
for _ in range(steps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1000)
times.sort()
print(json.dumps({'ms': times[len(times) // 2], 'torch': torch.__version__, 'threads': torch.get_num_threads(),
                  'params': sum(p.numel() for p in model.parameters())}))
