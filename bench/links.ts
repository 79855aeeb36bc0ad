import { createModel, gpt2Config } from '../src/models/index.ts';
import { type Plan, stepSeconds } from '../src/plan/index.ts';
import { Generator, setBackend, tensor } from '../src/tensor/index.ts';
import { distribute, type DistributedJob } from '../src/user/index.ts';
import { waitFor } from '../test/helpers/processes.ts';
import { type ShapedSwarm, shapedSwarm } from '../test/helpers/shaped-swarm.ts';
import type { Row } from './gemm.ts';

const SLOW_MBIT = 10;
const SECTION = 'links';

const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

/**
 * Step time on shaped links, predicted against measured: a validator and three workers (js) in
 * Linux network namespaces on one switch, the user in this process; the link between the first
 * two workers the validator lists is shaped to 10 Mbit/s with tbf. A forward of 8192 tokens
 * (512 KiB of hidden states a hop) runs on layer-aware's plan (which avoids the slow link)
 * and on parameter-balanced's (which crosses it, in the validator's order). Needs root and
 * iproute2; skipped with a note otherwise.
 */
export async function benchLinks(quick: boolean): Promise<Row[]> {
  let swarm: ShapedSwarm;
  try {
    setBackend('js');
    swarm = await shapedSwarm(SLOW_MBIT);
  } catch (err) {
    if ((err as Error).name !== 'NetnsUnavailableError') throw err;
    process.stderr.write(`links: skipped, it needs network namespaces: ${(err as Error).message}\n`);
    return [{
      section: SECTION, case: 'links: skipped (needs root and iproute2 for network namespaces)', value: Number.NaN, unit: 'ms',
      reference: 'predicted', referenceValue: Number.NaN, ratio: Number.NaN,
    }];
  }
  const jobs: DistributedJob[] = [];
  try {
    const { user: u, boot, order: [a, b], records: recs } = swarm;
    const probed = recs.get(a)!.proximity[b].mbps;

    const model = createModel(gpt2Config({ vocabSize: 64, hidden: 16, layers: 3, heads: 2, maxPositions: 64 }), { seed: 3 });
    const shape = [256, 32];
    const tokens = shape[0] * shape[1];
    const rng = new Generator(4);
    const ids = tensor(Array.from({ length: tokens }, () => rng.int(64)), shape, 'int32');
    const options = { tokens, verify: { sampleRate: 0 } };
    const good = await distribute(u, boot, model, { strategy: 'layer-aware', ...options });
    jobs.push(good);
    const bad = await distribute(u, boot, model, { strategy: 'parameter-balanced', ...options });
    jobs.push(bad);
    for (let i = 0; i < 3; i++) for (const job of jobs) await job.logits(ids);
    const from = Date.now();
    const times: [number[], number[]] = [[], []];
    for (let round = 0; round < (quick ? 3 : 7); round++) {
      for (const [i, job] of jobs.entries()) {
        const t0 = performance.now();
        await job.logits(ids);
        times[i].push(performance.now() - t0);
      }
    }
    const inbound = await waitFor('the job\'s transfers in an announcement', async () => {
      const p = (await swarm.refresh()).get(b)?.proximity[a]?.inbound;
      return p && p.measuredAt >= from && p;
    }, 10_000).then((r) => r.value, () => null);

    const [tGood, tBad] = times.map(median);
    const row = (name: string, plan: Plan, ms: number): Row => {
      const predicted = stepSeconds(plan) * 1000;
      return { section: SECTION, case: `links: forward [${shape}], ${name}`, value: ms, unit: 'ms', reference: 'predicted', referenceValue: predicted, ratio: ms / predicted };
    };
    const predictedFactor = stepSeconds(bad.plan) / stepSeconds(good.plan);
    return [
      row(`layer-aware, around the ${SLOW_MBIT} Mbit/s link (${good.plan.stages.length} stages)`, good.plan, tGood),
      row(`parameter-balanced, through it (${bad.plan.stages.length} stages)`, bad.plan, tBad),
      {
        section: SECTION, case: 'links: speed-up of layer-aware', value: tBad / tGood, unit: '×', reference: 'predicted', referenceValue: predictedFactor,
        ratio: tBad / tGood / predictedFactor,
      },
      { section: SECTION, case: `links: the ${SLOW_MBIT} Mbit/s link by probe`, value: probed, unit: 'Mbit/s', reference: 'tbf rate', referenceValue: SLOW_MBIT, ratio: probed / SLOW_MBIT },
      {
        section: SECTION, case: `links: the ${SLOW_MBIT} Mbit/s link by the job's transfers`, value: inbound?.mbps ?? Number.NaN, unit: 'Mbit/s',
        reference: 'tbf rate', referenceValue: SLOW_MBIT, ratio: (inbound?.mbps ?? Number.NaN) / SLOW_MBIT,
      },
    ];
  } finally {
    await Promise.all(jobs.map((j) => j.close().catch(() => {})));
    await swarm.stop();
  }
}
