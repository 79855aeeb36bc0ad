import { createModel, generateWith, gpt2Config, localStepModel, type StepModel } from '../src/models/index.ts';
import { distribute, startValidator, startWorker } from '../src/node/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { setBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';

const NEW_TOKENS = 16;

/** Prefill time of a 128-token prompt and the mean time of each further decoded token. */
async function measure(run: (maxNewTokens: number) => Promise<unknown>): Promise<{ prefill: number; decode: number }> {
  await run(2); // warm-up
  const t0 = performance.now();
  await run(1);
  const prefill = performance.now() - t0;
  const t1 = performance.now();
  await run(NEW_TOKENS + 1);
  return { prefill, decode: (performance.now() - t1 - prefill) / NEW_TOKENS };
}

/**
 * Decoding across 1, 2 and 3 stages on loopback (workers in this process, real libp2p
 * sockets) against local decoding, with a 768-wide hidden state: latency per token, the
 * overhead per stage, and prefill throughput; hidden states going worker to worker (chain,
 * the default) and, for comparison, relayed through the user.
 */
export async function benchDistributed(): Promise<Row[]> {
  setBackend('ort', { threads: 1 });
  const config = gpt2Config({ vocabSize: 4096, hidden: 768, layers: 6, heads: 12, maxPositions: 256 });
  const model = createModel(config, { seed: 0 });
  const prompt = Array.from({ length: 128 }, (_, i) => (i * 37) % 4096);
  const local = await measure((n) => generateWith(localStepModel(model) as StepModel, [prompt], { maxNewTokens: n, stopTokens: [] }));
  const rows: Row[] = [];
  for (const [stages, routing] of [
    [1, 'chain'],
    [2, 'chain'],
    [3, 'chain'],
    [3, 'relay'],
  ] as const) {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const workers = await Promise.all(Array.from({ length: stages }, () => startWorker({ bootstrap: boot, memoryBytes: 2 ** 30 })));
    const user = await createNode();
    try {
      const dm = await distribute(user, boot, model, { strategy: 'parameter-balanced', routing });
      const t = await measure((n) => dm.generate(prompt, { maxNewTokens: n, stopTokens: [] }));
      await dm.close();
      const label = `${stages} stage${stages > 1 ? 's' : ''}, ${routing === 'chain' ? 'worker → worker' : 'relayed by the user'}`;
      rows.push(
        {
          section: 'distributed',
          case: `decode 1 token, ${label} on loopback (768 wide, 6 blocks)`,
          value: t.decode,
          unit: 'ms',
          reference: 'local decoding',
          referenceValue: local.decode,
          ratio: t.decode / local.decode,
        },
        {
          section: 'distributed',
          case: `overhead per stage, ${label}`,
          value: (t.decode - local.decode) / stages,
          unit: 'ms',
          reference: 'target per hop',
          referenceValue: 1,
          ratio: (t.decode - local.decode) / stages,
          target: '≤ 1 ms',
        },
        {
          section: 'distributed',
          case: `prefill 128 tokens, ${label}`,
          value: 128 / (t.prefill / 1000),
          unit: 'tok/s',
          reference: 'local prefill',
          referenceValue: 128 / (local.prefill / 1000),
          ratio: local.prefill / t.prefill,
        },
      );
    } finally {
      await user.stop();
      await Promise.all(workers.map((w) => w.stop()));
      await validator.stop();
    }
  }
  return rows;
}
