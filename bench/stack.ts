import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { AdamW, LayerNorm, Linear, Module, ModuleList } from '../src/nn/index.ts';
import { createOrtBackend, Generator, randn, type Tensor, withBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import { timeSync } from './timing.ts';

/** One GPT-2-small MLP block: x + proj(gelu(fc(ln(x)))). */
class Block extends Module {
  readonly ln: LayerNorm;
  readonly fc: Linear;
  readonly proj: Linear;
  constructor(rng: Generator) {
    super();
    this.ln = this.addModule('ln', new LayerNorm(768));
    this.fc = this.addModule('fc', new Linear(768, 3072, { rng }));
    this.proj = this.addModule('proj', new Linear(3072, 768, { rng }));
  }

  forward(x: Tensor): Tensor {
    return x.add(this.proj.forward(this.fc.forward(this.ln.forward(x)).gelu()));
  }
}

class Stack extends Module {
  readonly blocks: ModuleList<Block>;
  constructor(layers: number) {
    super();
    const rng = new Generator(0);
    this.blocks = this.addModule(
      'blocks',
      new ModuleList(Array.from({ length: layers }, () => new Block(rng))),
    );
  }

  forward(x: Tensor): Tensor {
    for (const b of this.blocks) x = b.forward(x);
    return x;
  }
}

export const PYTHON = '/usr/bin/python3';

function torchStep(layers: number, tokens: number, threads: number, steps: number): number | null {
  if (!existsSync(PYTHON)) return null;
  const script = fileURLToPath(new URL('./torch/stack.py', import.meta.url));
  try {
    const out = execFileSync(
      PYTHON,
      [script, String(layers), String(tokens), String(threads), String(steps)],
      {
        encoding: 'utf8',
        stdio: ['ignore', 'pipe', 'ignore'],
        env: { ...process.env, OMP_NUM_THREADS: String(threads), OPENBLAS_NUM_THREADS: String(threads) },
      },
    );
    return (JSON.parse(out) as { ms: number }).ms;
  } catch {
    return null;
  }
}

/**
 * Forward + backward + AdamW step of a GPT-2-small-shaped stack (12 blocks, 4×128 tokens)
 * on the ort backend, against PyTorch on the CPU with the same threads.
 */
export function benchStack(
  threads: number[],
  layers = 12,
  tokens = 512,
  steps = 3,
  withTorch = true,
  spinning: boolean | 'auto' = 'auto',
): Row[] {
  const rows: Row[] = [];
  const model = new Stack(layers);
  const opt = new AdamW(model.parameters(), { lr: 1e-4 });
  const x = randn([tokens / 128, 128, 768], { seed: 1 });
  for (const t of threads) {
    const backend = createOrtBackend({ threads: t, spinning });
    const step = () =>
      withBackend(backend, () => {
        model.forward(x).pow(2).mean().backward();
        opt.step();
        opt.zeroGrad();
      });
    const ms = timeSync(step, { warmup: 1, minRuns: steps, budgetMs: 0 });
    const ref = withTorch ? torchStep(layers, tokens, t, steps) : null;
    rows.push({
      section: 'train-step',
      case: `${layers}×(LN, 768→3072, GELU, 3072→768), ${tokens} tokens, fwd+bwd+AdamW, ${t} thread${t > 1 ? 's' : ''}`,
      value: ms,
      unit: 'ms',
      reference: ref === null ? 'PyTorch CPU (not installed)' : 'PyTorch CPU',
      referenceValue: ref ?? Number.NaN,
      ratio: ref === null ? Number.NaN : ms / ref,
    });
  }
  return rows;
}
