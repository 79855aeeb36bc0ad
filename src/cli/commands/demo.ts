import { multiaddr } from '@multiformats/multiaddr';
import { additionTask, taskBatch } from '../../data/index.ts';
import { byteLevelTokenizerJson, createModel, evaluateExactMatch, gpt2Config, HFTokenizer } from '../../models/index.ts';
import { parseStatsAnswer, request, type TensorLinkNode, traffic } from '../../p2p/index.ts';
import type { Address } from 'viem';
import { MIN_STAKE } from '../../chain/index.ts';
import type { LocalSwarm } from '../../swarm/index.ts';
import { tokens as tlk } from './nodes.ts';
import { type DistributedModel, distribute, listWorkers } from '../../user/index.ts';
import { Generator, getBackend } from '../../tensor/index.ts';
import { type Flags, intFlag, stringFlag, UsageError, verifyFlags } from '../args.ts';
import { bar, type Output } from '../output.ts';
import { DEFAULT_DASHBOARD, startSwarm } from '../swarm.ts';
import { CHEAT_KINDS } from '../../worker/index.ts';

/** What the demo's user pays into escrow for its job: the validators release the price of the verified FLOPs from it. */
const DEMO_PAYMENT = 10n * 10n ** 18n;

interface Earning {
  worker: string;
  peerId: string;
  account: string;
  stake: string;
  earned: string;
  claimed: string;
  balance: string;
  slashed: boolean;
}

/**
 * Closes the epoch at the validator (which posts the reward root on the chain) and waits for
 * the workers to claim their rewards by themselves; who earned what, read from the chain.
 */
async function settleAndClaim(node: TensorLinkNode, swarm: LocalSwarm, names: Map<string, string>, cheater: string | null) {
  const boot = multiaddr(swarm.bootstrap);
  const settled = await request(node, boot, { type: 'ledger-settle' }, 120_000);
  const rewards = settled.rewards as Record<string, string>;
  const chain = swarm.chain!.user;
  const rows: Earning[] = [];
  const deadline = Date.now() + 30_000;
  for (const w of swarm.workers) {
    const account = w.account as Address;
    const earned = BigInt(rewards[account] ?? '0');
    let claimed = await chain.claimedBy(account);
    while (claimed < earned && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 250));
      claimed = await chain.claimedBy(account);
    }
    const stake = await chain.stakeOf(account);
    rows.push({
      worker: names.get(w.peerId) ?? short(w.peerId), peerId: w.peerId, account, stake: stake.toString(), earned: earned.toString(),
      claimed: claimed.toString(), balance: (await chain.balanceOf(account)).toString(), slashed: w.peerId === cheater && stake < MIN_STAKE,
    });
  }
  rows.sort((a, b) => a.worker.localeCompare(b.worker));
  const show = await request(node, boot, { type: 'ledger-show' });
  const validator = BigInt(rewards[swarm.validator.account!] ?? '0');
  const records = show.records as number;
  return { epoch: settled.epoch as number, rows, records, validator: validator.toString(), blocks: show.height as number };
}

/** The share of the workers' records the validator re-runs in the demo (`--verify-rate` sets another). */
const DEMO_VERIFY_RATE = 0.02;

const BATCH = 64;
const LR = 6e-3;
const SAMPLES = 6;

const short = (peerId: string) => `…${peerId.slice(-6)}`;

/** What each kind of cheating does, as the demo says it. */
const CHEATS: Record<string, string> = {
  'noise': 'adds noise to what it computes',
  'skip': 'returns its input instead of running its layers',
  'stale': 'never applies its optimizer steps',
  'scale-grad': 'doubles its gradients',
  'zero': 'returns zeros',
  'replay': 'returns earlier results',
  'free-ride': 'sends zero gradients',
};
const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
const thousands = (n: number) => n.toLocaleString('en-US');

/**
 * `tensorlink demo`: the main job on a local swarm. A validator and three honest workers start
 * as processes of their own, with a fourth that cheats (`--cheat KIND`, noise by default; `none`
 * for an honest swarm); a small transformer is split across the workers (the user keeps the
 * embedding and the head), trained on 2-digit addition through a pipeline schedule while the
 * validator re-runs a sample of the workers' signed computations, scored on held-out sums
 * generated across the swarm, and summed up. Everything stops on exit or Ctrl-C.
 */
export async function demoCommand(flags: Flags, out: Output): Promise<void> {
  const steps = intFlag(flags, 'steps', 600);
  const seed = intFlag(flags, 'seed', 1, 0);
  const workers = intFlag(flags, 'workers', 3);
  const microBatches = intFlag(flags, 'micro-batches', 2);
  const schedule = stringFlag(flags, 'schedule') ?? '1f1b';
  if (schedule !== 'gpipe' && schedule !== '1f1b') throw new UsageError('--schedule must be gpipe or 1f1b');
  if (microBatches > BATCH) throw new UsageError(`--micro-batches must be at most the batch of ${BATCH}`);
  // one worker cheats unless `--cheat none`: the demo shows the swarm catching it
  const cheat = stringFlag(flags, 'cheat') ?? 'noise';
  // re-runs cost the validator a section's forward or backward each, on a 2-core machine shared by six processes: the
  // demo re-runs 2% (a cheater on every computation has 4 checkable records a step: caught within 13 steps on average,
  // 57 at 99%)
  // the records re-run follow the demo's seed: the same run twice re-runs the same records
  const verify = { ...verifyFlags(flags), seed: seed + 7 };
  verify.sampleRate ??= cheat === 'none' ? 0 : DEMO_VERIFY_RATE;
  if (cheat !== 'none' && !(CHEAT_KINDS as readonly string[]).includes(cheat)) throw new UsageError(`--cheat must be none or one of ${CHEAT_KINDS.join(', ')}`);
  const started = performance.now();
  out.info('TensorLink demo: a transformer split across a swarm of workers learns to add.\n');
  const all = cheat === 'none' ? workers : workers + 1;
  out.info(`[1/5] starting a local swarm: a validator and ${all} workers, each its own process on 127.0.0.1`
    + `${cheat === 'none' ? '' : `; one of them cheats (${cheat}), to show that the swarm catches it`}`);
  const swarm = await startSwarm(all, flags, cheat === 'none' ? undefined : [...Array<undefined>(workers), cheat], true, DEFAULT_DASHBOARD);
  const chain = swarm.chain!;
  const node = swarm.user.node;
  let dm: DistributedModel | null = null;
  try {
    const records = await listWorkers(node, multiaddr(swarm.bootstrap));
    const names = new Map(records.map((r, i) => [r.peerId, `worker ${String.fromCharCode(65 + i)}`]));
    const cheater = cheat === 'none' ? null : swarm.workers[workers].peerId;
    out.info(`  validator  ${short(swarm.validator.peerId)}  ${swarm.bootstrap.split('/p2p/')[0]}  bootstrap peer, registry of workers, planner's source, `
      + `re-runs a random ${100 * verify.sampleRate}% of the workers' signed computations`);
    for (const r of records) {
      const c = r.capabilities!;
      const note = r.peerId === cheater ? `  CHEATS: ${CHEATS[cheat] ?? cheat} (--fault ${cheat})` : '';
      out.info(`  ${names.get(r.peerId)}   ${short(r.peerId)}  ${c.backend}, ${c.gflops.toFixed(1)} GFLOP/s measured, ${mib(c.memoryBytes)} offered${note}`);
    }
    out.info(`  you (user) ${short(node.peerId.toString())}  keeps the embedding and the head: token ids and logits never leave this process`);
    out.info(`  chain      anvil at ${chain.deployment.rpc}: token, staking, escrow and settlement contracts; each worker staked `
      + `${tlk(MIN_STAKE)} to be given work`);
    if (swarm.dashboard) out.info(`  dashboard  ${swarm.dashboard}/  the swarm live in a browser: the job, its loss, the checks, the ledger`);
    out.info('');

    const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    // one block per worker, the cheater's too: it holds a section until it is caught
    const config = gpt2Config({ vocabSize: 257, hidden: 64, layers: all, heads: 4, maxPositions: 32 });
    const model = createModel(config, { seed });
    model.tokenizer = tokenizer;
    const task = additionTask({ seed, padded: true });
    out.info(`[2/5] the model: GPT-2 shaped, ${config.layers} blocks, 64 wide, ${thousands(model.numParameters())} parameters; the task: `
      + `2-digit sums written "07+38=045" (${thousands(task.train.length)} to learn from, ${task.test.length} held out)`);
    dm = await distribute(node, swarm.bootstrap, model, { strategy: 'parameter-balanced', verify, name: 'demo: 2-digit sums' });
    const job = dm;
    // the user pays for the job up front, into escrow: the validators release it against the work the ledger holds (the
    // job planned again once the cheater is caught runs under an id that names this one, and is paid from this escrow)
    await chain.user.deposit(job.jobId, node.peerId.toString(), DEMO_PAYMENT);
    out.info('  plan (parameter-balanced: the largest section as small as it can be, so no worker waits on a bigger one):');
    for (const [i, a] of dm.assignment.entries()) {
      const stage = dm.plan.stages[i];
      const layers = model.layers.slice(a.start, a.end).map((l) => l.name).join(', ');
      out.info(`    ${names.get(a.peerId)}: ${layers} (${thousands(stage.params)} parameters, ${mib(stage.bytes)})`);
    }
    out.info('    you: embedding, final norm and head\n');

    out.info(`[3/5] training across the swarm: ${steps} steps of ${BATCH} sums, ${microBatches} micro-batches per step through a `
      + `${schedule === '1f1b' ? '1F1B' : 'GPipe'} schedule; each worker keeps its own AdamW`);
    const trainer = await dm.trainer({ optimizer: { lr: LR }, totalSteps: steps, microBatches, schedule });
    const rng = new Generator(seed + 1);
    const busy = new Map<string, number>();
    let caught = 0;
    let tokens = 0;
    let loss = Number.NaN;
    const trainStart = performance.now();
    for (let step = 1; step <= steps; step++) {
      const r = await trainer.step(taskBatch(task, tokenizer, rng, BATCH, tokenizer.eosTokenId ?? 0));
      loss = r.loss;
      tokens += r.tokens;
      const v = r.verification;
      for (const peer of v.flagged.slice(caught)) {
        out.info(`  step ${String(step).padStart(4)}  ${names.get(peer) ?? short(peer)} was CAUGHT: the validator re-ran one of its signed computations and got `
          + 'another result. It is flagged and excluded; the job went back to its last verified state (the start) and replayed '
          + `${v.replayedSteps} steps on the honest workers`);
      }
      caught = v.flagged.length;
      const stageNames = job.assignment.map((a) => names.get(a.peerId)!.replace('worker ', ''));
      r.busy.slice(1, -1).forEach((b, i) => busy.set(job.assignment[i].peerId, (busy.get(job.assignment[i].peerId) ?? 0) + b[0]));
      const seconds = (performance.now() - trainStart) / 1000;
      const perWorker = r.busy.slice(1, -1).map((b, i) => `${stageNames[i]} ${(1000 * b[0]).toFixed(0)}ms`).join(' ');
      out.progress(`  ${bar(step / steps)} ${step}/${steps}  loss ${loss.toFixed(4)}  ${thousands(Math.round(tokens / seconds))} tok/s  workers ${perWorker}`);
      if (step % Math.max(1, Math.floor(steps / 4)) === 0 || step === steps) {
        out.info(`  step ${String(step).padStart(4)}  loss ${loss.toFixed(4)}  ${seconds.toFixed(0)} s`);
      }
    }
    const trainSeconds = (performance.now() - trainStart) / 1000;

    out.info(`\n[4/5] exact match on the ${task.test.length} held-out sums, each answer generated across the swarm`);
    const generator = { tokenizer, generateBatch: job.generateBatch.bind(job) };
    const evaluation = await evaluateExactMatch(generator, task.test, { terminator: task.terminator, maxNewTokens: 4, batchSize: 250 });
    out.info(`  ${(100 * evaluation.accuracy).toFixed(1)}% right (${Math.round(evaluation.accuracy * task.test.length)} of ${task.test.length})\n`);

    out.info('[5/5] a few of them, token by token as the swarm produces them:');
    const wrong = task.test.map((e, i) => ({ e, i })).filter(({ e, i }) => evaluation.predictions[i] !== e.answer).slice(0, 2);
    const picks = [...task.test.slice(0, SAMPLES - wrong.length).map((e) => e), ...wrong.map(({ e }) => e)];
    const samples = [];
    for (const example of picks) {
      out.progress('');
      process.stderr.write(`  ${example.prompt}`);
      const produced: number[] = [];
      const { tokens: ids } = await job.generate(tokenizer.encode(example.prompt), {
        maxNewTokens: 4,
        stopTokens: tokenizer.encode(task.terminator),
        onToken: (t) => {
          produced.push(t);
          const text = tokenizer.decode([t]);
          if (text !== task.terminator) process.stderr.write(text);
        },
      });
      const answer = tokenizer.decode(ids).split(task.terminator)[0];
      const right = answer === example.answer;
      process.stderr.write(`  ${right ? 'right' : `wrong (${example.answer})`}\n`);
      samples.push({ prompt: example.prompt, answer, expected: example.answer, right });
    }

    await job.settle();
    const earnings = await settleAndClaim(node, swarm, names, cheater);
    const verification = job.verification!;
    const stats = await Promise.all(records.map(async (r) => ({ record: r, stats: parseStatsAnswer(await request(node, r, { type: 'stats' })) })));
    const moved = traffic.received + stats.reduce((n, s) => n + s.stats.bytesReceived, 0);
    const seconds = (performance.now() - started) / 1000;
    const perWorker = stats.map(({ record, stats: s }) => {
      const i = dm!.assignment.findIndex((a) => a.peerId === record.peerId);
      const work = s.work;
      return {
        worker: names.get(record.peerId)!,
        peerId: record.peerId,
        layers: i >= 0 ? [dm!.assignment[i].start, dm!.assignment[i].end - 1] : null,
        busySeconds: busy.get(record.peerId) ?? 0,
        cheater: record.peerId === cheater,
        excluded: verification.flagged.includes(record.peerId),
        ...work,
        bytesReceived: s.bytesReceived,
        bytesSent: s.bytesSent,
      };
    });
    const summary = {
      accuracy: evaluation.accuracy,
      heldOut: task.test.length,
      steps,
      finalLoss: loss,
      trainSeconds,
      seconds,
      tokensPerSecond: tokens / trainSeconds,
      bytesMoved: moved,
      parameters: model.numParameters(),
      schedule,
      microBatches,
      backend: getBackend().name,
      workers: perWorker,
      verification,
      samples,
      epoch: earnings.epoch,
      earnings: earnings.rows,
      validatorEarned: earnings.validator,
    };
    const lines = [
      '',
      'summary',
      `  exact match on ${task.test.length} held-out sums: ${(100 * evaluation.accuracy).toFixed(1)}%`,
      `  time: ${seconds.toFixed(0)} s in all, ${trainSeconds.toFixed(0)} s of training (${thousands(Math.round(tokens / trainSeconds))} tok/s), final loss ${loss.toFixed(4)}`,
      `  moved between peers: ${mib(moved)} (activations and gradients, weights, control)`,
      `  verification: ${verification.checked} computations re-run by the validator, ${verification.failed} failed; `
      + `${verification.flagged.length === 0 ? 'no worker caught' : `caught ${verification.flagged.map((p) => names.get(p) ?? short(p)).join(', ')}`}`
      + `${verification.replayedSteps > 0 ? `, ${verification.replayedSteps} steps replayed` : ''}`,
      ...perWorker.map((w) => `  ${w.worker} ${short(w.peerId)}: `
        + `${w.excluded ? 'EXCLUDED (caught cheating), ' : w.layers ? `layer ${w.layers[0]}${w.layers[1] !== w.layers[0] ? `–${w.layers[1]}` : ''}, ` : ''}`
        + `${thousands(w.trainForwards)} forwards, ${thousands(w.trainBackwards)} backwards, ${w.optimizerSteps} optimizer steps, `
        + `${thousands(w.forwards)} decoding forwards, busy ${w.busySeconds.toFixed(1)} s`),
      `  earnings, read from the chain (epoch ${earnings.epoch}; the user paid ${tlk(DEMO_PAYMENT)} into the job's escrow, `
      + `the ledger holds ${thousands(earnings.records)} accepted records):`,
      ...earnings.rows.map((e) => `  ${e.worker} ${e.account.slice(0, 10)}…: `
        + `${e.slashed ? `SLASHED: stake ${tlk(MIN_STAKE)} → ${tlk(e.stake)}, earned nothing` : `earned ${tlk(e.earned)}, claimed ${tlk(e.claimed)}`}`
        + `, balance ${tlk(e.balance)}`),
      `  validator ${short(swarm.validator.peerId)}: earned ${tlk(earnings.validator)} for the ${earnings.blocks} blocks it signed`,
    ];
    out.result(summary, lines.join('\n'));
  } finally {
    await dm?.close();
    await swarm.close();
  }
}
