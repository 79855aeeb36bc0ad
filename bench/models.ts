import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createModel, gpt2Config, KVCache } from '../src/models/index.ts';
import { AdamW } from '../src/nn/index.ts';
import { createOrtBackend, crossEntropy, noGrad, randint, setBackend, tensor } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import { PYTHON } from './stack.ts';

interface TorchTimes {
  forwardMs: number;
  trainStepMs: number;
  decodeMs: number;
}

function torchGpt2(threads: number, batch: number, seq: number): TorchTimes | null {
  if (!existsSync(PYTHON)) return null;
  const script = fileURLToPath(new URL('./torch/gpt2.py', import.meta.url));
  const env: NodeJS.ProcessEnv = { ...process.env, OMP_NUM_THREADS: String(threads) };
  // OpenBLAS tuning variables set on these machines are left out of this command alone (as the issue asks).
  delete env.OPENBLAS_CORETYPE;
  delete env.OPENBLAS_L2_SIZE;
  try {
    const out = execFileSync(PYTHON, [script, String(threads), String(batch), String(seq)], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      env,
    });
    return JSON.parse(out) as TorchTimes;
  } catch {
    return null;
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** The median milliseconds of `runs` calls of `fn`, after one to warm up. */
export function time(fn: () => void, runs: number): number {
  fn();
  const times: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

/**
 * GPT-2 small (124M, random weights): forward on B×T tokens, a training step on the same
 * batch, and one decoded token with a KV cache after a T-token prompt, against PyTorch on
 * the CPU at the same thread count.
 */
export function benchGpt2(threads: number[], batch = 4, seq = 128, runs = 3): Row[] {
  const model = createModel(gpt2Config(), { seed: 0 });
  const ids = randint(0, 50257, [batch, seq], { seed: 1 });
  const targets = tensor(
    Array.from({ length: batch * seq }, (_, i) => (i % seq === seq - 1 ? -100 : ids.data[i + 1])),
    [batch, seq],
    'int32',
  );
  const opt = new AdamW(model.parameters(), { lr: 1e-4 });
  const rows: Row[] = [];
  for (const t of threads) {
    setBackend(createOrtBackend({ threads: t }));
    const forward = time(() => noGrad(() => model.forward(ids)), runs);
    const step = time(() => {
      crossEntropy(model.forward(ids), targets).backward(undefined, { releaseActivations: true });
      opt.step();
      opt.releaseGrads();
    }, runs);
    const cache = new KVCache(model.config.layers);
    noGrad(() => model.forward(ids.narrow(0, 0, 1), { cache }));
    let token = 0;
    const decode = time(() => {
      const logits = noGrad(() => model.forward(tensor([token], [1, 1], 'int32'), { cache }));
      token = logits.argmax(-1).data[0];
    }, 12);
    const ref = torchGpt2(t, batch, seq);
    const label = `${t} thread${t > 1 ? 's' : ''}`;
    const add = (what: string, value: number, refValue: number | undefined) =>
      rows.push({
        section: 'gpt2',
        case: `GPT-2 124M ${what}, ${label}`,
        value,
        unit: 'ms',
        reference: refValue === undefined ? 'PyTorch CPU (not installed)' : 'PyTorch CPU',
        referenceValue: refValue ?? Number.NaN,
        ratio: refValue === undefined ? Number.NaN : value / refValue,
        target: '≤ 1.25',
      });
    add(`forward ${batch}×${seq}`, forward, ref?.forwardMs);
    add(`train step ${batch}×${seq}`, step, ref?.trainStepMs);
    add(`decode 1 token (KV cache, ${seq} cached)`, decode, ref?.decodeMs);
  }
  return rows;
}
