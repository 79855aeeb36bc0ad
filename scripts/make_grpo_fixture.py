#!/usr/bin/python3
"""GRPO's objective in PyTorch, written from the papers' formulas, for test/rl/grpo.test.ts.

  /usr/bin/python3 scripts/make_grpo_fixture.py    # Debian's python3-torch; writes test/fixtures/grpo.json

Two prompts, G = 4 completions each, 5 positions (padding masked out), float64. For each variant (GRPO as
DeepSeekMath, Dr. GRPO, DAPO) it writes the advantages, the loss and its gradient in the policy's log-probabilities,
computed by autograd through torch.min and torch.clamp, as TRL's GRPOTrainer computes them.
"""
import json
import os

import torch

torch.manual_seed(0)
N, T, G = 8, 5, 4
lengths = [5, 3, 4, 2, 5, 5, 1, 3]
mask = torch.zeros(N, T, dtype=torch.float64)
for i, n in enumerate(lengths):
    mask[i, :n] = 1
rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0], dtype=torch.float64)
old = -torch.rand(N, T, dtype=torch.float64) * 3 - 0.1
# the policy moved since the rollouts: some ratios beyond the clip range on either side
logp = old + torch.randn(N, T, dtype=torch.float64) * 0.3
ref = old + torch.randn(N, T, dtype=torch.float64) * 0.2

VARIANTS = {
    'grpo': dict(clip_low=0.2, clip_high=0.2, beta=0.04, aggregation='sequence', scale='group-std'),
    'dr-grpo': dict(clip_low=0.2, clip_high=0.2, beta=0.0, aggregation='constant', scale='none', max_tokens=6),
    'dapo': dict(clip_low=0.2, clip_high=0.28, beta=0.0, aggregation='token', scale='group-std'),
    'grpo-kl-token': dict(clip_low=0.2, clip_high=0.28, beta=0.1, aggregation='token', scale='group-std'),
}


def advantages(scale):
    r = rewards.view(-1, G)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale == 'none':
        return centred.view(-1)
    return (centred / (r.std(dim=1, keepdim=True) + 1e-4)).view(-1)


def loss_of(v):
    lp = logp.clone().requires_grad_(True)
    a = advantages(v['scale']).unsqueeze(1)
    ratio = torch.exp(lp - old)
    surrogate = torch.min(ratio * a, torch.clamp(ratio, 1 - v['clip_low'], 1 + v['clip_high']) * a)
    kl = torch.exp(ref - lp) - (ref - lp) - 1
    per_token = -(surrogate - v['beta'] * kl)
    if v['aggregation'] == 'sequence':
        loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1)).mean()
    elif v['aggregation'] == 'token':
        loss = (per_token * mask).sum() / mask.sum()
    else:
        loss = (per_token * mask).sum() / (N * v['max_tokens'])
    loss.backward()
    clipped = ((torch.clamp(ratio, 1 - v['clip_low'], 1 + v['clip_high']) * a < ratio * a).double() * mask).sum() / mask.sum()
    return {
        'advantages': advantages(v['scale']).tolist(),
        'loss': loss.item(),
        'grad': lp.grad.reshape(-1).tolist(),
        'clipped': clipped.item(),
    }


out = {
    'groupSize': G,
    'shape': [N, T],
    'rewards': rewards.tolist(),
    'mask': mask.reshape(-1).tolist(),
    'logprobs': logp.reshape(-1).tolist(),
    'oldLogprobs': old.reshape(-1).tolist(),
    'refLogprobs': ref.reshape(-1).tolist(),
    'torch': torch.__version__,
    'variants': {name: {**v, **loss_of(v)} for name, v in VARIANTS.items()},
}
path = os.path.join(os.path.dirname(__file__), '..', 'test', 'fixtures', 'grpo.json')
with open(path, 'w') as f:
    json.dump(out, f, indent=1)
print(f'wrote {path}')
