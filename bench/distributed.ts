import { createModel, generateWith, gpt2Config, localStepModel, type StepModel } from '../src/models/index.ts';
import { distribute } from '../src/user/index.ts';
import { startValidator } from '../src/validator/index.ts';
import { startWorker } from '../src/worker/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { setBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';

const NEW_TOKENS = 16;

type Run = (maxNewTokens: number, onToken?: () => void) => Promise<unknown>;

const median = (v: number[]) => [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)];

/** Per-token times of a generation (from `onToken` timestamps, the first two dropped) and its prefill. */
async function tokens(run: Run): Promise<{ prefill: number; perToken: number[] }> {
  const t0 = performance.now();
  await run(1);
  const prefill = performance.now() - t0;
  const perToken: number[] = [];
  let t = performance.now();
  await run(NEW_TOKENS + 2, () => {
    const now = performance.now();
    perToken.push(now - t);
    t = now;
  });
  return { prefill, perToken: perToken.slice(2) };
}

/**
 * Median time per decoded token and median prefill of two contenders, measured in turns
 * (`rounds` times each) so that passing load on this shared machine touches both alike.
 */
type Timing = { prefill: number; decode: number };

async function measurePair(a: Run, b: Run, rounds = 5): Promise<[Timing, Timing]> {
  await a(2);
  await b(2);
  const ra = { prefill: [] as number[], perToken: [] as number[] };
  const rb = { prefill: [] as number[], perToken: [] as number[] };
  for (let i = 0; i < rounds; i++) {
    for (const [run, acc] of [[a, ra], [b, rb]] as const) {
      const r = await tokens(run);
      acc.prefill.push(r.prefill);
      acc.perToken.push(...r.perToken);
    }
  }
  return [
    { prefill: median(ra.prefill), decode: median(ra.perToken) },
    { prefill: median(rb.prefill), decode: median(rb.perToken) },
  ];
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
  const localRun: Run = (n, onToken) =>
    generateWith(localStepModel(model) as StepModel, [prompt], { maxNewTokens: n, stopTokens: [], onToken });
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
      const [t, local] = await measurePair((n, onToken) => dm.generate(prompt, { maxNewTokens: n, stopTokens: [], onToken }), localRun);
      // hops a decoding step makes: user → first worker, worker → worker, last worker → user (relayed: two per stage)
      const hops = routing === 'chain' ? stages + 1 : 2 * stages;
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
          case: `overhead per hop (${hops} hops), ${label}`,
          value: (t.decode - local.decode) / hops,
          unit: 'ms',
          reference: 'target per hop',
          referenceValue: 1,
          ratio: (t.decode - local.decode) / hops,
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
