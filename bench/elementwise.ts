import { createOrtBackend, jsBackend, noGrad, randn, withBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import { timePair } from './timing.ts';

/** Transcendental elementwise ops on a GPT-2 MLP activation ([512, 3072]): ort against js. */
export async function benchElementwise(): Promise<Row[]> {
  const ort = createOrtBackend({ threads: 1 });
  const x = randn([512, 3072], { seed: 1 });
  const rows: Row[] = [];
  for (const op of ['gelu', 'exp', 'tanh', 'silu'] as const) {
    const [js, fast] = await timePair(
      () => withBackend(jsBackend, () => noGrad(() => x[op]())),
      () => withBackend(ort, () => noGrad(() => x[op]())),
      { budgetMs: 1000 },
    );
    rows.push({
      section: 'elementwise',
      case: `${op} forward, 512×3072, ort 1 thread vs js`,
      value: fast,
      unit: 'ms',
      reference: 'js backend',
      referenceValue: js,
      ratio: fast / js,
    });
  }
  return rows;
}
