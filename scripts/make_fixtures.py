#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures the engine's tests compare against.

Run with Debian's python3-torch:  /usr/bin/python3 scripts/make_fixtures.py
Outputs test/fixtures/torch-ops.json and test/fixtures/torch-optim.json (small, committed,
so CI needs no PyTorch). Each op case records its inputs, the output, and the gradient of
sum(output * w) with respect to every float input, for a fixed random w.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
OUT = os.path.join(os.path.dirname(__file__), '..', 'test', 'fixtures')


def enc(t):
    return {'shape': list(t.shape), 'dtype': 'int32' if t.dtype in (torch.int32, torch.int64) else 'float32',
            'data': [float(v) for v in t.detach().reshape(-1).tolist()]}


def rn(*shape, positive=False):
    t = torch.randn(*shape)
    return t.abs() + 0.5 if positive else t


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def sdpa(q, k, v, causal, mask=None):
    tq, tk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(mask == 0, float('-inf'))
    if causal:
        c = torch.ones(tq, tk, dtype=torch.bool).triu(tk - tq + 1)
        s = s.masked_fill(c, float('-inf'))
    return torch.softmax(s, -1) @ v


CASES = {
    'add_broadcast': (lambda a, b: a + b, [rn(2, 3, 4), rn(3, 1)]),
    'sub_broadcast': (lambda a, b: a - b, [rn(2, 3, 4), rn(4)]),
    'mul_broadcast': (lambda a, b: a * b, [rn(2, 1, 4), rn(3, 4)]),
    'div_broadcast': (lambda a, b: a / b, [rn(2, 3, 4), rn(1, 4, positive=True)]),
    'pow_scalar': (lambda a: a ** 3, [rn(3, 4)]),
    'pow_tensor': (lambda a, b: a ** b, [rn(3, 4, positive=True), rn(3, 4)]),
    'neg': (lambda a: -a, [rn(3, 4)]),
    'exp': (torch.exp, [rn(3, 4)]),
    'log': (torch.log, [rn(3, 4, positive=True)]),
    'sqrt': (torch.sqrt, [rn(3, 4, positive=True)]),
    'rsqrt': (torch.rsqrt, [rn(3, 4, positive=True)]),
    'tanh': (torch.tanh, [rn(3, 4)]),
    'sigmoid': (torch.sigmoid, [rn(3, 4)]),
    'silu': (F.silu, [rn(3, 4)]),
    'gelu': (gelu_new, [rn(3, 4)]),
    'relu': (F.relu, [rn(3, 4)]),
    'matmul_2d': (torch.matmul, [rn(5, 6), rn(6, 3)]),
    'matmul_batched': (torch.matmul, [rn(2, 3, 5, 6), rn(2, 3, 6, 4)]),
    'matmul_broadcast': (torch.matmul, [rn(2, 1, 5, 6), rn(3, 6, 4)]),
    'matmul_3d_2d': (torch.matmul, [rn(2, 5, 6), rn(6, 4)]),
    'matmul_vec': (torch.matmul, [rn(6), rn(6, 4)]),
    'linear': (lambda x, w, b: F.linear(x, w, b), [rn(2, 5, 6), rn(4, 6), rn(4)]),
    'sum_dims': (lambda a: a.sum(dim=(0, 2)), [rn(2, 3, 4)]),
    'sum_keepdim': (lambda a: a.sum(dim=1, keepdim=True), [rn(2, 3, 4)]),
    'sum_all': (lambda a: a.sum(), [rn(2, 3, 4)]),
    'mean_dim': (lambda a: a.mean(dim=-1), [rn(2, 3, 4)]),
    'mean_all': (lambda a: a.mean(), [rn(2, 3, 4)]),
    'max_dim': (lambda a: a.max(dim=1).values, [rn(2, 3, 4)]),
    'softmax': (lambda a: torch.softmax(a, dim=-1), [rn(2, 3, 5)]),
    'softmax_dim1': (lambda a: torch.softmax(a, dim=1), [rn(2, 3, 5)]),
    'log_softmax': (lambda a: torch.log_softmax(a, dim=-1), [rn(2, 3, 5)]),
    'layer_norm': (lambda x, w, b: F.layer_norm(x, (8,), w, b, 1e-5), [rn(2, 3, 8), rn(8), rn(8)]),
    'rms_norm': (lambda x, w: rms_norm(x, w), [rn(2, 3, 8), rn(8)]),
    'embedding': (lambda w, ids: F.embedding(ids, w), [rn(7, 4), torch.tensor([[1, 3, 3], [6, 0, 1]], dtype=torch.int32)]),
    'attention_causal': (lambda q, k, v: sdpa(q, k, v, True), [rn(2, 2, 4, 8), rn(2, 2, 4, 8), rn(2, 2, 4, 8)]),
    'attention_past': (lambda q, k, v: sdpa(q, k, v, True), [rn(1, 2, 2, 8), rn(1, 2, 5, 8), rn(1, 2, 5, 8)]),
    'attention_mask': (lambda q, k, v, m: sdpa(q, k, v, True, m),
                       [rn(2, 2, 3, 4), rn(2, 2, 3, 4), rn(2, 2, 3, 4),
                        torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.int32).reshape(2, 1, 1, 3)]),
    'cross_entropy': (lambda x, t: F.cross_entropy(x.reshape(-1, 6), t.reshape(-1).long()),
                      [rn(2, 3, 6), torch.tensor([[0, 5, 2], [1, 1, 4]], dtype=torch.int32)]),
    'cross_entropy_ignore': (lambda x, t: F.cross_entropy(x.reshape(-1, 6), t.reshape(-1).long(), ignore_index=-100),
                             [rn(2, 3, 6), torch.tensor([[0, -100, 2], [1, -100, 4]], dtype=torch.int32)]),
    'transpose': (lambda a: a.transpose(0, 2), [rn(2, 3, 4)]),
    'permute': (lambda a: a.permute(2, 0, 1), [rn(2, 3, 4)]),
    'reshape': (lambda a: a.reshape(4, 6), [rn(2, 3, 4)]),
    'narrow': (lambda a: a.narrow(1, 1, 2), [rn(2, 3, 4)]),
    'cat': (lambda a, b: torch.cat([a, b], dim=1), [rn(2, 3, 4), rn(2, 2, 4)]),
    'expand': (lambda a: a.expand(2, 3, 4), [rn(3, 1)]),
    'gather': (lambda a, i: a.gather(1, i.long()), [rn(2, 4), torch.tensor([[0, 3, 3], [2, 1, 0]], dtype=torch.int32)]),
    'index_select': (lambda a, i: a.index_select(0, i.long()), [rn(4, 3), torch.tensor([3, 0, 3], dtype=torch.int32)]),
}


def run_case(fn, inputs):
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    w = torch.randn(out.shape)
    (out * w).sum().backward()
    return {
        'inputs': [enc(t) for t in inputs],
        'output': enc(out),
        'weight': enc(w),
        'grads': [enc(t.grad) if t.grad is not None else None for t in leaves],
    }


def optim_cases():
    cases = {}
    for name, make in {
        'adamw': lambda p: torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
        'adamw_defaults': lambda p: torch.optim.AdamW([p], lr=0.001),
        'sgd_momentum': lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.9, weight_decay=0.01),
        'sgd_nesterov': lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.9, nesterov=True),
    }.items():
        p0 = torch.randn(3, 4)
        target = torch.randn(3, 4)
        p = p0.clone().requires_grad_(True)
        opt = make(p)
        traj = []
        for _ in range(10):
            opt.zero_grad()
            loss = ((p - target) ** 2 * torch.arange(1, 13).reshape(3, 4)).sum()
            loss.backward()
            opt.step()
            traj.append(enc(p.detach().clone()))
        cases[name] = {'p0': enc(p0), 'target': enc(target), 'trajectory': traj}
    # clip_grad_norm_
    a, b = torch.randn(3, 4).requires_grad_(), torch.randn(5).requires_grad_()
    a.grad, b.grad = torch.randn(3, 4) * 3, torch.randn(5) * 3
    ga, gb = a.grad.clone(), b.grad.clone()
    norm = torch.nn.utils.clip_grad_norm_([a, b], 1.5)
    cases['clip'] = {'grads': [enc(ga), enc(gb)], 'maxNorm': 1.5, 'norm': float(norm), 'clipped': [enc(a.grad), enc(b.grad)]}
    return cases


def main():
    os.makedirs(OUT, exist_ok=True)
    ops = {name: run_case(fn, inputs) for name, (fn, inputs) in CASES.items()}
    with open(os.path.join(OUT, 'torch-ops.json'), 'w') as f:
        json.dump({'torch': torch.__version__, 'cases': ops}, f)
    with open(os.path.join(OUT, 'torch-optim.json'), 'w') as f:
        json.dump({'torch': torch.__version__, 'cases': optim_cases()}, f)
    safetensors_fixture()
    print(f'wrote {len(ops)} op cases and optimizer cases to {OUT}')



def safetensors_fixture():
    """A small safetensors file written byte by byte from PyTorch's own F16/BF16/F32/I64
    encodings, and the float32 values PyTorch decodes them to."""
    tensors = {
        'half': torch.randn(3, 5).half(),
        'bfloat': torch.randn(4, 2).bfloat16(),
        'float': torch.randn(2, 3),
        'ids': torch.tensor([[1, -2, 3]], dtype=torch.int64),
    }
    codes = {torch.float16: 'F16', torch.bfloat16: 'BF16', torch.float32: 'F32', torch.int64: 'I64'}
    header, blobs, offset = {'__metadata__': {'format': 'pt'}}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {'dtype': codes[t.dtype], 'shape': list(t.shape), 'data_offsets': [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b' ' * ((8 - (len(text) + 8) % 8) % 8)
    with open(os.path.join(OUT, 'torch-mixed.safetensors'), 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text + b''.join(blobs))
    expected = {name: enc(t.float() if t.is_floating_point() else t) for name, t in tensors.items()}
    with open(os.path.join(OUT, 'torch-mixed.json'), 'w') as f:
        json.dump(expected, f)



if __name__ == '__main__':
    main()
