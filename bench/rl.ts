/**
 * `npm run bench -- --only rl` (opt-in): GRPO on 2-digit addition (rewards 1 for the exact sum, 0 else; 32 prompts × 8
 * completions a step, 60 steps), from weak starts trained with cross-entropy:
 * - a GPT-2 shaped model (the demo's: 4 blocks, 64 wide; 250 steps of 64 sums), every weight trained: in this process,
 *   and as a private job over three worker processes (their rollouts generated across them);
 * - a small Llama (4 blocks, 64 wide; 230 steps), a LoRA adapter (r 8, every projection) trained: in this process, and
 *   over three host processes that serve the Llama for everyone (`worker --host`), which hold the adapter, step it and
 *   generate the rollouts with it.
 * Held-out exact match (500 sums, greedy) every 10 steps; the
 * curves as an SVG (bench/out/rl.svg; `node scripts/svg-to-png.mjs bench/out/rl.svg docs/rl.png` renders the
 * README's). `--quick`: 20 steps.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { additionTask, taskBatch } from '../src/data/index.ts';
import {
  adaptModel, byteLevelTokenizerJson, type CausalLM, createModel, gpt2Config, HFTokenizer, llamaConfig, loadModel, LocalTrainer, saveModel,
} from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import {
  generateRollouts, jobPolicy, localPolicy, rl, type RlResult, type RlStepStats, rlTaskByName, type RolloutGenerator,
} from '../src/rl/index.ts';
import { Generator } from '../src/tensor/index.ts';
import { distribute, type DistributeOptions, HostedModel } from '../src/user/index.ts';
import { type Running, startNode } from '../test/helpers/processes.ts';
import type { Row } from './gemm.ts';

const SFT_STEPS = 250;
const LR = 5e-4;
/** The Llama's weak start, and its adapter's learning rate (a Llama of this size diverges at the GPT-2's 6e-3). */
const LLAMA_SFT_STEPS = 230;
const LLAMA_LR = 3e-3;
const LORA = { r: 8, alpha: 16, targets: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'], seed: 3 };
const GRPO = { prompts: 32, groupSize: 8, preset: 'grpo' as const, grpo: { beta: 0 }, evalEvery: 10, evalSize: 500, seed: 1 };

/** Two panels (held-out exact match, mean reward) over steps, a line for each run. */
function curvesSvg(runs: { label: string; colour: string; result: RlResult }[], steps: number): string {
  const [w, h, left, top] = [900, 220, 60, 40];
  const x = (s: number) => left + (s / steps) * (w - left - 230);
  const parts: string[] = [];
  const panel = (at: number, title: string, pick: (r: RlResult) => [number, number][]) => {
    const y = (v: number) => at + h - v * h;
    parts.push(`<text x="${left}" y="${at - 10}" font-size="15" font-weight="bold">${title}</text>`);
    parts.push(`<rect x="${left}" y="${at}" width="${w - left - 230}" height="${h}" fill="none" stroke="#999"/>`);
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      parts.push(`<text x="${left - 6}" y="${y(v) + 4}" font-size="11" text-anchor="end">${100 * v}%</text>`);
      parts.push(`<line x1="${left}" x2="${w - 230}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
    }
    for (let s = 0; s <= steps; s += 10) parts.push(`<text x="${x(s)}" y="${at + h + 14}" font-size="11" text-anchor="middle">${s}</text>`);
    runs.forEach((r, i) => {
      const d = pick(r.result).map(([s, v], j) => `${j ? 'L' : 'M'}${x(s).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
      parts.push(`<path d="${d}" fill="none" stroke="${r.colour}" stroke-width="2"/>`);
      parts.push(`<rect x="${w - 215}" y="${at + 8 + 18 * i}" width="12" height="3" fill="${r.colour}"/>`);
      parts.push(`<text x="${w - 198}" y="${at + 13 + 18 * i}" font-size="12">${r.label}</text>`);
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
    const progress = (what: string) => (s: RlStepStats) => {
      if (s.accuracy !== undefined) log(`  ${what}, step ${s.step}: reward ${s.reward.toFixed(3)}, held-out ${(100 * s.accuracy).toFixed(1)}%`);
    };
    // the weak starts: cross-entropy on the sums for a few steps
    const weakStart = async (model: CausalLM, lr: number, steps: number, name: string) => {
      model.tokenizer = tok;
      const sft = new LocalTrainer(model, { lr, totalSteps: 600 });
      const rng = new Generator(2);
      const sums = additionTask({ seed: 1, padded: true });
      for (let s = 0; s < steps; s++) sft.step(taskBatch(sums, tok, rng, 64, tok.eosTokenId ?? 0));
      const path = join(dir, name);
      await saveModel(model, path);
      return path;
    };
    const start = await weakStart(createModel(gpt2Config({ vocabSize: 257, hidden: 64, layers: 4, heads: 4, maxPositions: 32 }), { seed: 1 }), 6e-3, SFT_STEPS, 'start');
    const llamaConfigOf = llamaConfig({ vocabSize: 257, hidden: 64, layers: 4, heads: 4, kvHeads: 2, intermediate: 128, maxPositions: 32 });
    const llama = await weakStart(createModel(llamaConfigOf, { seed: 1 }), LLAMA_LR, LLAMA_SFT_STEPS, 'adder');
    const task = rlTaskByName('addition', 1);

    const t0 = performance.now();
    const alone = await rl({
      ...GRPO, task, steps, policy: localPolicy(await loadModel(start), { lr: LR, totalSteps: steps, warmupSteps: 0, microBatches: 2 }),
      onStep: progress('one process'),
    });
    const aloneSeconds = (performance.now() - t0) / 1000;

    const validator = await startNode(['validator']);
    running.push(validator);
    for (let i = 0; i < 3; i++) running.push(await startNode(['worker', '--bootstrap', validator.addrs[0], '--threads', '1']));
    // GRPO over a distributed job (its workers or hosts generate the rollouts and train), timed
    const overJob = async (
      what: string, dir: string, options: DistributeOptions, lr: number,
      how: { measure?: (policy: RolloutGenerator) => Promise<void>; overlap?: 'before' | 'beside'; steps?: number } = {},
    ) => {
      const user = await createNode();
      const t = performance.now();
      const n = how.steps ?? steps;
      try {
        const dm = await distribute(user, validator.addrs[0], dir, { training: true, verify: { sampleRate: 0.02 }, ...options });
        // beside: the rollouts drawn by a second job of the adapter, not training, while the first takes its step
        const drawer = how.overlap === 'beside' ? await distribute(user, validator.addrs[0], dir, { verify: { sampleRate: 0.02 }, ...options }) : null;
        try {
          log(`  ${what}: ${dm.assignment.map((x) => `…${x.peerId.slice(-6)} layers ${x.start}–${x.end - 1}`).join(', ')}`);
          const trainer = await dm.trainer({ optimizer: { lr }, totalSteps: n, warmupSteps: 0, microBatches: 2, schedule: '1f1b' });
          const policy = jobPolicy(dm, trainer, tok, drawer ? { rollouts: drawer } : {});
          const evalEvery = how.steps === undefined ? GRPO.evalEvery : n;
          const overlap = how.overlap !== undefined;
          const result = await rl({ ...GRPO, task, steps: n, policy, evalEvery, overlap, onStep: progress(what) });
          await how.measure?.(dm);
          const v = await dm.settle();
          log(`  ${what}: ${v?.checked ?? 0} records re-run by the validator, ${v?.failed ?? 0} failed`);
          return { result, seconds: (performance.now() - t) / 1000 };
        } finally {
          await drawer?.close();
          await dm.close();
        }
      } finally {
        await user.stop();
      }
    };
    const { result: swarm, seconds: swarmSeconds } = await overJob('three workers', start, { strategy: 'parameter-balanced' }, LR);

    // the Llama and its adapter: in this process, then over three hosts serving it for everyone
    const local = await loadModel(llama);
    adaptModel(local, LORA, { seed: LORA.seed });
    const t2 = performance.now();
    const llamaAlone = await rl({
      ...GRPO, task, steps, policy: localPolicy(local, { lr: LLAMA_LR, totalSteps: steps, warmupSteps: 0, microBatches: 2 }),
      onStep: progress('Llama + LoRA, one process'),
    });
    const llamaAloneSeconds = (performance.now() - t2) / 1000;
    for (const span of ['0-1', '2-2', '3-3']) running.push(await startNode(['worker', '--bootstrap', validator.addrs[0], '--threads', '1', '--host', `adder=${llama}:${span}`]));
    // the rollouts' rate against the hosts' own batched decoding: the same rollouts (32 prompts × 8 completions, two
    // batches a sample) drawn over the adapter job, as a hosted session of the model (no adapter: its blocks only), and
    // the job's own batched decoding of them without RL's log-probabilities; in turn, the median of 9 samples each
    const rates = { job: [] as number[], hosts: [] as number[], plain: [] as number[] };
    const compare = async (policy: RolloutGenerator) => {
      const user = await createNode();
      const base = await HostedModel.open(user, validator.addrs[0], 'adder', { ends: llama });
      const served: RolloutGenerator = { generateBatch: async (p, o) => ({ tokens: await base.generateBatch(p, o) }) };
      const rng = new Generator(7);
      const options = (seed: number) => ({ maxNewTokens: task.maxNewTokens, terminator: task.terminator, seed });
      try {
        // a first round unmeasured (the hosted session's route is measured on its first use)
        for (let i = 0; i < 10; i++) {
          const rounds = [0, 1].map(() => Array.from({ length: GRPO.prompts }, () => task.prompts[rng.int(task.prompts.length)]));
          // each sample's order turned by one: none always follows the same one (a session's checks, the ledger's submissions)
          const kinds = ['job', 'hosts', 'plain'] as const;
          for (const which of kinds.map((_, k) => kinds[(i + k) % kinds.length])) {
            const t = performance.now();
            let tokens = 0;
            for (const [k, prompts] of rounds.entries()) {
              if (which === 'plain') {
                const ids = prompts.flatMap((p) => Array.from({ length: GRPO.groupSize }, () => tok.encode(p)));
                const rows = ids.map((_, r) => ({ temperature: 1, seed: 2 * i + k + r }));
                const stopTokens = tok.encode(task.terminator);
                const out = await policy.generateBatch(ids, { maxNewTokens: task.maxNewTokens, stopTokens, rows });
                tokens += out.tokens.reduce((n, t) => n + t.length, 0);
                continue;
              }
              const made = await generateRollouts(which === 'job' ? policy : served, tok, prompts, GRPO.groupSize, options(2 * i + k));
              tokens += made.reduce((n, r) => n + r.completion.length, 0);
            }
            if (i > 0) rates[which].push(tokens / ((performance.now() - t) / 1000));
          }
        }
      } finally {
        await base.close();
        await user.stop();
      }
    };
    const { result: hosted, seconds: hostedSeconds } = await overJob('Llama + LoRA, three hosts', llama, { hosted: 'adder', adapter: LORA }, LLAMA_LR, { measure: compare });
    // overlapped (rollouts one step stale), 20 steps: drawn before each step on the training job, or beside it on a second job
    const over = { steps: 20 };
    const before = await overJob('Llama + LoRA, three hosts, overlapped, drawn before each step', llama, { hosted: 'adder', adapter: LORA }, LLAMA_LR, { ...over, overlap: 'before' });
    const beside = await overJob('Llama + LoRA, three hosts, overlapped, drawn beside each step', llama, { hosted: 'adder', adapter: LORA }, LLAMA_LR, { ...over, overlap: 'beside' });
    const same = JSON.stringify(before.result.steps.map((s) => s.loss)) === JSON.stringify(beside.result.steps.map((s) => s.loss));
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
    log(`  rollouts over the adapter job ${rates.job.map((r) => r.toFixed(0)).join(', ')} tok/s; the same as a hosted session of the model `
      + `${rates.hosts.map((r) => r.toFixed(0)).join(', ')} tok/s; the job's batched decoding ${rates.plain.map((r) => r.toFixed(0)).join(', ')} tok/s`);
    if (out) {
      mkdirSync(dirname(out), { recursive: true });
      writeFileSync(out, curvesSvg([
        { label: 'GPT-2, one process', colour: '#1f77b4', result: alone },
        { label: 'GPT-2, 3 workers', colour: '#ff7f0e', result: swarm },
        { label: 'Llama+LoRA, one process', colour: '#2ca02c', result: llamaAlone },
        { label: 'Llama+LoRA, 3 hosts', colour: '#d62728', result: hosted },
      ], steps));
      log(`  curves written to ${out}`);
    }
    const pts = (r: RlResult) => 100 * ((r.accuracyAfter ?? 0) - (r.accuracyBefore ?? 0));
    const tps = (r: RlResult) => r.steps.reduce((n, s) => n + s.rolloutTokensPerSecond, 0) / r.steps.length;
    return [
      { section: 'rl', case: `GRPO on addition, one process: held-out exact match ${(100 * alone.accuracyBefore!).toFixed(1)}% → ${(100 * alone.accuracyAfter!).toFixed(1)}% in ${steps} steps (${aloneSeconds.toFixed(0)} s)`, value: pts(alone), unit: 'points', reference: 'target', referenceValue: 20, ratio: pts(alone) / 20, target: '≥ 20 points' },
      { section: 'rl', case: `the same over three worker processes: ${(100 * swarm.accuracyBefore!).toFixed(1)}% → ${(100 * swarm.accuracyAfter!).toFixed(1)}% (${swarmSeconds.toFixed(0)} s)`, value: pts(swarm), unit: 'points', reference: 'one process', referenceValue: pts(alone), ratio: pts(swarm) / pts(alone) },
      { section: 'rl', case: 'rollout tokens/s, three workers against one process', value: tps(swarm), unit: 'tok/s', reference: 'one process', referenceValue: tps(alone), ratio: tps(swarm) / tps(alone) },
      { section: 'rl', case: `a Llama's LoRA, one process: ${(100 * llamaAlone.accuracyBefore!).toFixed(1)}% → ${(100 * llamaAlone.accuracyAfter!).toFixed(1)}% (${llamaAloneSeconds.toFixed(0)} s)`, value: pts(llamaAlone), unit: 'points', reference: 'target', referenceValue: 20, ratio: pts(llamaAlone) / 20, target: '≥ 20 points' },
      { section: 'rl', case: `the same over three hosts of the Llama: ${(100 * hosted.accuracyBefore!).toFixed(1)}% → ${(100 * hosted.accuracyAfter!).toFixed(1)}% (${hostedSeconds.toFixed(0)} s)`, value: pts(hosted), unit: 'points', reference: 'target', referenceValue: 20, ratio: pts(hosted) / 20, target: '≥ 20 points' },
      { section: 'rl', case: 'rollout tokens/s, three hosts against one process (Llama + LoRA)', value: tps(hosted), unit: 'tok/s', reference: 'one process', referenceValue: tps(llamaAlone), ratio: tps(hosted) / tps(llamaAlone) },
      { section: 'rl', case: `overlapped GRPO over the three hosts (Llama + LoRA, 20 steps), rollouts drawn beside each step by a second job against before it on the training job: wall time; ${same ? 'the same losses' : 'LOSSES DIFFER'}, held-out ${(100 * beside.result.accuracyAfter!).toFixed(1)}%`, value: beside.seconds, unit: 's', reference: 'drawn before', referenceValue: before.seconds, ratio: beside.seconds / before.seconds, target: '< 1' },
      { section: 'rl', case: 'rollout tokens/s over the three hosts (Llama + LoRA) against their batched decoding of the same (the job\'s, without log-probabilities)', value: median(rates.job), unit: 'tok/s', reference: 'the job\'s batched decoding', referenceValue: median(rates.plain), ratio: median(rates.job) / median(rates.plain), target: '≥ 0.8×' },
      { section: 'rl', case: 'rollout tokens/s over the three hosts (Llama + LoRA) against the hosts\' batched decoding of the model alone (a hosted session, no adapter)', value: median(rates.job), unit: 'tok/s', reference: 'a hosted session', referenceValue: median(rates.hosts), ratio: median(rates.job) / median(rates.hosts), target: '≥ 0.8×' },
    ];
  } finally {
    for (const r of running) r.child.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  }
}
