/**
 * `npm run bench -- --only rl` (opt-in): GRPO on 2-digit addition. A GPT-2 shaped model (the demo's: 4 blocks, 64
 * wide) is trained with cross-entropy to a weak start (250 steps of 64 sums), then by GRPO alone (rewards 1 for the
 * exact sum, 0 else; 32 prompts × 8 completions a step, 60 steps): in this process, and as a private job over three
 * worker processes (their rollouts generated across them). Held-out exact match (500 sums, greedy) every 10 steps; the
 * curves as an SVG (bench/out/rl.svg; `node scripts/svg-to-png.mjs bench/out/rl.svg docs/rl.png` renders the
 * README's). `--quick`: 20 steps.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { additionTask, taskBatch } from '../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, loadModel, LocalTrainer, saveModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { jobPolicy, localPolicy, rl, type RlResult, rlTaskByName } from '../src/rl/index.ts';
import { Generator } from '../src/tensor/index.ts';
import { distribute } from '../src/user/index.ts';
import { type Running, startNode } from '../test/helpers/processes.ts';
import type { Row } from './gemm.ts';

const SFT_STEPS = 250;
const LR = 5e-4;
const GRPO = { prompts: 32, groupSize: 8, preset: 'grpo' as const, grpo: { beta: 0 }, evalEvery: 10, evalSize: 500, seed: 1 };

/** Two panels (held-out exact match, mean reward) over steps, a line for each run. */
function curvesSvg(runs: { label: string; colour: string; result: RlResult }[], steps: number): string {
  const [w, h, left, top] = [900, 220, 60, 40];
  const x = (s: number) => left + (s / steps) * (w - left - 200);
  const parts: string[] = [];
  const panel = (at: number, title: string, pick: (r: RlResult) => [number, number][]) => {
    const y = (v: number) => at + h - v * h;
    parts.push(`<text x="${left}" y="${at - 10}" font-size="15" font-weight="bold">${title}</text>`);
    parts.push(`<rect x="${left}" y="${at}" width="${w - left - 200}" height="${h}" fill="none" stroke="#999"/>`);
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      parts.push(`<text x="${left - 6}" y="${y(v) + 4}" font-size="11" text-anchor="end">${100 * v}%</text>`);
      parts.push(`<line x1="${left}" x2="${w - 200}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
    }
    for (let s = 0; s <= steps; s += 10) parts.push(`<text x="${x(s)}" y="${at + h + 14}" font-size="11" text-anchor="middle">${s}</text>`);
    runs.forEach((r, i) => {
      const d = pick(r.result).map(([s, v], j) => `${j ? 'L' : 'M'}${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
      parts.push(`<path d="${d}" fill="none" stroke="${r.colour}" stroke-width="2"/>`);
      parts.push(`<rect x="${w - 185}" y="${at + 8 + 18 * i}" width="12" height="3" fill="${r.colour}"/>`);
      parts.push(`<text x="${w - 168}" y="${at + 13 + 18 * i}" font-size="12">${r.label}</text>`);
    });
  };
  panel(top, 'Held-out exact match (500 sums, greedy)', (r) => [[0, r.accuracyBefore ?? 0], ...r.steps.flatMap((s) => (s.accuracy === undefined ? [] : [[s.step, s.accuracy] as [number, number]]))]);
  panel(top + h + 70, 'Mean reward of the rollouts (exact sums, sampled)', (r) => r.steps.map((s) => [s.step, s.reward]));
  const height = top + 2 * h + 110;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>${parts.join('\n')}`
    + `<text x="${x(steps / 2)}" y="${height - 10}" font-size="12" text-anchor="middle">GRPO steps</text></svg>`;
}

export async function benchRl(quick: boolean, log: (s: string) => void, out?: string): Promise<Row[]> {
  const steps = quick ? 20 : 60;
  const dir = mkdtempSync(join(tmpdir(), 'tl-bench-rl-'));
  const running: Running[] = [];
  const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  try {
    // the weak start: cross-entropy on the sums for a few steps
    const model = createModel(gpt2Config({ vocabSize: 257, hidden: 64, layers: 4, heads: 4, maxPositions: 32 }), { seed: 1 });
    model.tokenizer = tok;
    const sft = new LocalTrainer(model, { lr: 6e-3, totalSteps: 600 });
    const rng = new Generator(2);
    const sums = additionTask({ seed: 1, padded: true });
    for (let s = 0; s < SFT_STEPS; s++) sft.step(taskBatch(sums, tok, rng, 64, tok.eosTokenId ?? 0));
    const start = join(dir, 'start');
    await saveModel(model, start);
    const task = rlTaskByName('addition', 1);

    const t0 = performance.now();
    const alone = await rl({
      ...GRPO, task, steps, policy: localPolicy(await loadModel(start), { lr: LR, totalSteps: steps, warmupSteps: 0, microBatches: 2 }),
      onStep: (s) => s.accuracy !== undefined && log(`  one process, step ${s.step}: reward ${s.reward.toFixed(3)}, held-out ${(100 * s.accuracy).toFixed(1)}%`),
    });
    const aloneSeconds = (performance.now() - t0) / 1000;

    const validator = await startNode(['validator']);
    running.push(validator);
    for (let i = 0; i < 3; i++) running.push(await startNode(['worker', '--bootstrap', validator.addrs[0], '--threads', '1']));
    const node = await createNode();
    const t1 = performance.now();
    let swarm: RlResult;
    try {
      const dm = await distribute(node, validator.addrs[0], start, { strategy: 'parameter-balanced', training: true, verify: { sampleRate: 0.02 } });
      try {
        const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: steps, warmupSteps: 0, microBatches: 2, schedule: '1f1b' });
        swarm = await rl({
          ...GRPO, task, steps, policy: jobPolicy(dm, trainer, tok),
          onStep: (s) => s.accuracy !== undefined && log(`  three workers, step ${s.step}: reward ${s.reward.toFixed(3)}, held-out ${(100 * s.accuracy).toFixed(1)}%`),
        });
        const v = await dm.settle();
        log(`  three workers: ${v?.checked ?? 0} records re-run by the validator, ${v?.failed ?? 0} failed`);
      } finally {
        await dm.close();
      }
    } finally {
      await node.stop();
    }
    const swarmSeconds = (performance.now() - t1) / 1000;
    if (out) {
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, curvesSvg([
        { label: 'one process', colour: '#1f77b4', result: alone },
        { label: 'three workers', colour: '#ff7f0e', result: swarm },
      ], steps));
      log(`  curves written to ${out}`);
    }
    const pts = (r: RlResult) => 100 * ((r.accuracyAfter ?? 0) - (r.accuracyBefore ?? 0));
    const tps = (r: RlResult) => r.steps.reduce((n, s) => n + s.rolloutTokensPerSecond, 0) / r.steps.length;
    return [
      { section: 'rl', case: `GRPO on addition, one process: held-out exact match ${(100 * alone.accuracyBefore!).toFixed(1)}% → ${(100 * alone.accuracyAfter!).toFixed(1)}% in ${steps} steps (${aloneSeconds.toFixed(0)} s)`, value: pts(alone), unit: 'points', reference: 'target', referenceValue: 20, ratio: pts(alone) / 20, target: '≥ 20 points' },
      { section: 'rl', case: `the same over three worker processes: ${(100 * swarm.accuracyBefore!).toFixed(1)}% → ${(100 * swarm.accuracyAfter!).toFixed(1)}% (${swarmSeconds.toFixed(0)} s)`, value: pts(swarm), unit: 'points', reference: 'one process', referenceValue: pts(alone), ratio: pts(swarm) / pts(alone) },
      { section: 'rl', case: 'rollout tokens/s, three workers against one process', value: tps(swarm), unit: 'tok/s', reference: 'one process', referenceValue: tps(alone), ratio: tps(swarm) / tps(alone) },
    ];
  } finally {
    for (const r of running) r.child.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
}
