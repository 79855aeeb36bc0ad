#!/usr/bin/env python3
"""Hugging Face transformers + PyTorch reference for bench/gpu/bench.ts, on the same GPU (CUDA).

usage: python3 torch_ref.py JSON
JSON: {"model_dir", "device": "cuda"|"cpu", "batches": [[prompt ids...]...], "new_tokens", "repeats",
       "prefill": [ids], "gpt2": {"batch", "seq", "vocab", "hidden", "layers", "heads", "positions"} | null,
       "threads"}
Loads the model our code saved (safetensors in float32) in bfloat16; decodes greedily with the KV
cache (transformers' forward, one token a step, as ours: the next token read back each step);
times a prompt's pass of len(prefill) tokens; times a GPT-2 training step (float32, AdamW) of
batch x seq tokens; measures a device-to-device copy (bytes read + written over time).
Prints one line of JSON.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

job = json.loads(sys.argv[1])
device = torch.device(job['device'])
torch.set_num_threads(job.get('threads', 2))
cuda = device.type == 'cuda'


def sync():
    if cuda:
        torch.cuda.synchronize()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


out = {'torch': torch.__version__, 'device': torch.cuda.get_device_name(0) if cuda else 'cpu', 'errors': []}
try:
    import transformers
    out['transformers'] = transformers.__version__
except ImportError as err:
    transformers = None
    out['errors'].append(f'transformers: {err}')

if cuda:
    # the copy ceiling: 1 GiB device to device, bytes read + written
    n = 2 ** 28
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    sync()
    out['copyBytesPerSecond'] = 2 * 4 * n * 10 / (start.elapsed_time(end) / 1000)
    del a, b

if transformers is not None:
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(job['model_dir'], dtype=torch.bfloat16)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(job['model_dir'], torch_dtype=torch.bfloat16)
    model = model.to(device).eval()
    out['loadSeconds'] = time.perf_counter() - t0
    decode = []
    with torch.no_grad():
        for prompts in job['batches']:
            ids = torch.tensor(prompts, dtype=torch.long, device=device)

            def once():
                o = model(input_ids=ids, use_cache=True)
                tok = o.logits[:, -1:].argmax(-1)
                first = tok[0, 0].item()
                t_first = time.perf_counter()
                tokens = [first]
                past = o.past_key_values
                for _ in range(job['new_tokens'] - 1):
                    o = model(input_ids=tok, past_key_values=past, use_cache=True)
                    past = o.past_key_values
                    tok = o.logits[:, -1:].argmax(-1)
                    tokens.append(tok[0, 0].item())
                sync()
                return (time.perf_counter() - t_first) * 1000 / (job['new_tokens'] - 1), tokens

            once()
            runs = [once() for _ in range(job['repeats'])]
            step_ms = median([r[0] for r in runs])
            decode.append({'batch': len(prompts), 'stepMs': step_ms, 'tokensPerSecond': 1000 * len(prompts) / step_ms, 'tokens': runs[0][1]})
        out['decode'] = decode
        if job['prefill']:
            ids = torch.tensor([job['prefill']], dtype=torch.long, device=device)
            times = []
            for i in range(job['repeats'] + 1):
                sync()
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=True).logits[:, -1].argmax(-1).item()
                if i > 0:
                    times.append(time.perf_counter() - t0)
            ms = 1000 * median(times)
            out['prefill'] = {'tokens': len(job['prefill']), 'ms': ms, 'tokensPerSecond': 1000 * len(job['prefill']) / ms}
    del model
    if cuda:
        torch.cuda.empty_cache()

    g = job.get('gpt2')
    if g:
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=g['vocab'], n_positions=g['positions'], n_embd=g['hidden'], n_layer=g['layers'], n_head=g['heads'])
        gpt2 = GPT2LMHeadModel(config).to(device).train()
        opt = torch.optim.AdamW(gpt2.parameters(), lr=1e-4)
        x = torch.randint(0, g['vocab'], (g['batch'], g['seq']), device=device)
        y = torch.randint(0, g['vocab'], (g['batch'], g['seq']), device=device)

        def step():
            logits = gpt2(input_ids=x).logits
            loss = F.cross_entropy(logits.reshape(-1, g['vocab']), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for _ in range(2):
            step()
        times = []
        for _ in range(job['repeats'] + 2):
            sync()
            t0 = time.perf_counter()
            loss = step().item()
            times.append(time.perf_counter() - t0)
        out['train'] = {'ms': 1000 * median(times), 'loss': loss, 'dtype': 'float32',
                        'attention': getattr(gpt2.config, '_attn_implementation', 'unknown')}

print(json.dumps(out))
