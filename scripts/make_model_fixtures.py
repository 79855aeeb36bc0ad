#!/usr/bin/env python3
"""Reference GPT-2 and Llama in plain PyTorch, written line for line after Hugging Face
transformers' modeling_gpt2.py and modeling_llama.py (transformers is not packaged for
Debian, so the script carries the architecture itself). It builds small random models and
writes, per model, a Hugging Face directory (config.json + model.safetensors) and the
expected logits, gradients and greedy continuation.

Run with Debian's python3-torch:  /usr/bin/python3 scripts/make_model_fixtures.py
Outputs test/fixtures/models/<name>/ (committed; CI needs no PyTorch).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), '..', 'test', 'fixtures', 'models')


def write_safetensors(path, tensors):
    header, blobs, offset = {'__metadata__': {'format': 'pt'}}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        code = {torch.float32: 'F32', torch.int32: 'I32', torch.int64: 'I64'}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {'dtype': code, 'shape': list(t.shape), 'data_offsets': [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b' ' * ((8 - (len(text) + 8) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text + b''.join(blobs))


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2:
    """GPT2LMHeadModel's forward over a name → tensor dict (Conv1D weights are [in, out])."""

    def __init__(self, cfg, p):
        self.c, self.p = cfg, p

    def conv1d(self, x, name):
        return torch.addmm(self.p[name + '.bias'], x.reshape(-1, x.shape[-1]), self.p[name + '.weight']).reshape(*x.shape[:-1], -1)

    def ln(self, x, name):
        return F.layer_norm(x, (x.shape[-1],), self.p[name + '.weight'], self.p[name + '.bias'], self.c['layer_norm_epsilon'])

    def forward(self, ids):
        c, p = self.c, self.p
        b, t = ids.shape
        pos = torch.arange(t).unsqueeze(0)
        h = p['transformer.wte.weight'][ids] + p['transformer.wpe.weight'][pos]
        nh, hd = c['n_head'], c['n_embd'] // c['n_head']
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        for i in range(c['n_layer']):
            pre = f'transformer.h.{i}'
            a = self.ln(h, pre + '.ln_1')
            q, k, v = self.conv1d(a, pre + '.attn.c_attn').split(c['n_embd'], dim=2)
            q, k, v = (z.view(b, t, nh, hd).permute(0, 2, 1, 3) for z in (q, k, v))
            w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
            w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min))
            w = torch.softmax(w, dim=-1)
            y = torch.matmul(w, v).permute(0, 2, 1, 3).reshape(b, t, c['n_embd'])
            h = h + self.conv1d(y, pre + '.attn.c_proj')
            m = self.conv1d(gelu_new(self.conv1d(self.ln(h, pre + '.ln_2'), pre + '.mlp.c_fc')), pre + '.mlp.c_proj')
            h = h + m
        h = self.ln(h, 'transformer.ln_f')
        return h @ p['transformer.wte.weight'].T


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Llama:
    """LlamaForCausalLM's forward over a name → tensor dict."""

    def __init__(self, cfg, p):
        self.c, self.p = cfg, p

    def rms(self, x, name):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.p[name + '.weight'] * (x * torch.rsqrt(var + self.c['rms_norm_eps']))

    def lin(self, x, name):
        return F.linear(x, self.p[name + '.weight'], self.p.get(name + '.bias'))

    def forward(self, ids):
        c, p = self.c, self.p
        b, t = ids.shape
        nh, nkv = c['num_attention_heads'], c['num_key_value_heads']
        hd = c['hidden_size'] // nh
        inv_freq = 1.0 / (c['rope_theta'] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        pos = torch.arange(t).float()
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        causal = torch.triu(torch.full((t, t), float('-inf')), diagonal=1)
        h = p['model.embed_tokens.weight'][ids]
        for i in range(c['num_hidden_layers']):
            pre = f'model.layers.{i}'
            a = self.rms(h, pre + '.input_layernorm')
            q = self.lin(a, pre + '.self_attn.q_proj').view(b, t, nh, hd).transpose(1, 2)
            k = self.lin(a, pre + '.self_attn.k_proj').view(b, t, nkv, hd).transpose(1, 2)
            v = self.lin(a, pre + '.self_attn.v_proj').view(b, t, nkv, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd) + causal
            w = torch.softmax(w, dim=-1, dtype=torch.float32)
            y = torch.matmul(w, v).transpose(1, 2).reshape(b, t, nh * hd)
            h = h + self.lin(y, pre + '.self_attn.o_proj')
            m = self.rms(h, pre + '.post_attention_layernorm')
            h = h + self.lin(F.silu(self.lin(m, pre + '.mlp.gate_proj')) * self.lin(m, pre + '.mlp.up_proj'), pre + '.mlp.down_proj')
        h = self.rms(h, 'model.norm')
        head = p['model.embed_tokens.weight'] if c['tie_word_embeddings'] else p['lm_head.weight']
        return h @ head.T


def gpt2_params(c):
    h, inner, n = c['n_embd'], c['n_inner'], {}
    n['transformer.wte.weight'] = torch.randn(c['vocab_size'], h) * 0.1
    n['transformer.wpe.weight'] = torch.randn(c['n_positions'], h) * 0.1
    for i in range(c['n_layer']):
        pre = f'transformer.h.{i}'
        for ln in ('ln_1', 'ln_2'):
            n[f'{pre}.{ln}.weight'] = 1 + 0.1 * torch.randn(h)
            n[f'{pre}.{ln}.bias'] = 0.1 * torch.randn(h)
        for name, (i_, o_) in {'attn.c_attn': (h, 3 * h), 'attn.c_proj': (h, h), 'mlp.c_fc': (h, inner), 'mlp.c_proj': (inner, h)}.items():
            n[f'{pre}.{name}.weight'] = torch.randn(i_, o_) * 0.1
            n[f'{pre}.{name}.bias'] = torch.randn(o_) * 0.05
    n['transformer.ln_f.weight'] = 1 + 0.1 * torch.randn(h)
    n['transformer.ln_f.bias'] = 0.1 * torch.randn(h)
    return n


def llama_params(c, qkv_bias):
    h, inner, n = c['hidden_size'], c['intermediate_size'], {}
    hd = h // c['num_attention_heads']
    kv = c['num_key_value_heads'] * hd
    n['model.embed_tokens.weight'] = torch.randn(c['vocab_size'], h) * 0.1
    for i in range(c['num_hidden_layers']):
        pre = f'model.layers.{i}'
        n[f'{pre}.input_layernorm.weight'] = 1 + 0.1 * torch.randn(h)
        for name, (i_, o_) in {'q_proj': (h, h), 'k_proj': (h, kv), 'v_proj': (h, kv), 'o_proj': (h, h)}.items():
            n[f'{pre}.self_attn.{name}.weight'] = torch.randn(o_, i_) * 0.1
            if qkv_bias and name != 'o_proj':
                n[f'{pre}.self_attn.{name}.bias'] = torch.randn(o_) * 0.05
        n[f'{pre}.post_attention_layernorm.weight'] = 1 + 0.1 * torch.randn(h)
        for name, (i_, o_) in {'gate_proj': (h, inner), 'up_proj': (h, inner), 'down_proj': (inner, h)}.items():
            n[f'{pre}.mlp.{name}.weight'] = torch.randn(o_, i_) * 0.1
    n['model.norm.weight'] = 1 + 0.1 * torch.randn(h)
    if not c['tie_word_embeddings']:
        n['lm_head.weight'] = torch.randn(c['vocab_size'], h) * 0.1
    return n


def build(name, cfg, params, model_cls):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(d, 'model.safetensors'), params)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    model = model_cls(cfg, leaves)
    ids = torch.randint(0, cfg['vocab_size'], (2, 7))
    logits = model.forward(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, cfg['vocab_size']), ids[:, 1:].reshape(-1))
    loss.backward()
    expected = {'input_ids': ids.to(torch.int32), 'logits': logits}
    for k, v in leaves.items():
        expected['grad.' + k] = v.grad
    write_safetensors(os.path.join(d, 'expected.safetensors'), expected)
    with torch.no_grad():
        seq = [3, 17, 5, 9]
        for _ in range(12):
            seq.append(int(model.forward(torch.tensor([seq]))[0, -1].argmax()))
    with open(os.path.join(d, 'expected.json'), 'w') as f:
        json.dump({'loss': float(loss), 'prompt': [3, 17, 5, 9], 'greedy': seq[4:]}, f)


def main():
    torch.manual_seed(2024)
    gpt2 = {'model_type': 'gpt2', 'vocab_size': 64, 'n_positions': 32, 'n_embd': 32, 'n_layer': 2, 'n_head': 4,
            'n_inner': 64, 'activation_function': 'gelu_new', 'layer_norm_epsilon': 1e-5, 'tie_word_embeddings': True}
    build('gpt2-tiny', gpt2, gpt2_params(gpt2), GPT2)
    llama = {'model_type': 'llama', 'vocab_size': 64, 'max_position_embeddings': 32, 'hidden_size': 32,
             'intermediate_size': 48, 'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2,
             'rms_norm_eps': 1e-6, 'rope_theta': 10000.0, 'hidden_act': 'silu', 'tie_word_embeddings': False}
    build('llama-tiny', llama, llama_params(llama, False), Llama)
    qwen = dict(llama, model_type='qwen2', tie_word_embeddings=True, rope_theta=1000000.0)
    build('qwen2-tiny', qwen, llama_params(qwen, True), Llama)
    print('wrote model fixtures to', OUT)


if __name__ == '__main__':
    main()
