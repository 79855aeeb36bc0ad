// Issue #51: GRPO's loop (src/rl/rl.ts). In one process, a policy learns what a reward asks (the reward rises); across
// three hosts of a model hosted for everyone, an adapter trained by GRPO gives the same rollouts, rewards and losses as
// one process, step for step (js: bit for bit), its rollouts generated through the hosts with the factors of the last
// step, and the hosts' factors a step further after each step. The built-in tasks' rewards, and a task of one's own.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { InvalidArgumentError } from '../../src/errors.ts';
import {
  adaptModel, byteLevelTokenizerJson, createModel, type GenerateOptions, HFTokenizer, llamaConfig, loadModel, type LoraConfig, saveModel,
  type TrainingBatch,
} from '../../src/models/index.ts';
import { multiaddr } from '@multiformats/multiaddr';
import { createNode, parseOverview, request } from '../../src/p2p/index.ts';
import { jobPolicy, loadTask, localPolicy, rl, type RlOptions, type RlResult, type RlTask, rlTaskByName } from '../../src/rl/index.ts';
import { setBackend, type Tensor } from '../../src/tensor/index.ts';
import { distribute, HostedModel } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { parseFault, parseHostSpec, startWorker, type Worker } from '../../src/worker/index.ts';
import { waitFor } from '../helpers/processes.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const config = llamaConfig({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 32 });
const LORA: LoraConfig = { r: 4, alpha: 8, targets: ['q_proj', 'v_proj', 'o_proj', 'down_proj'] };

/** A reward a random model gets 0.4 of: the share of a completion's characters that are printable ASCII. */
const ascii: RlTask = {
  name: 'ascii',
  prompts: Array.from({ length: 50 }, (_, i) => `${String.fromCharCode(97 + (i % 26))}${String.fromCharCode(97 + ((i * 7) % 26))}>`),
  test: [],
  terminator: '\n',
  maxNewTokens: 4,
  reward: (_prompt, completion) => {
    const chars = [...completion];
    return chars.length === 0 ? 0 : chars.filter((c) => c.charCodeAt(0) >= 32 && c.charCodeAt(0) < 127).length / chars.length;
  },
};

/**
 * A model hosted for everyone by three hosts (blocks 0-0, 1-1 with `fault`, 2-2) and their validator, one process's
 * overlapped run of the options given to `body` (seeded by `seed`) to compare with, and a user; `host` starts one more
 * (an honest one). Everything is stopped after `body`.
 */
async function withFaultyHost(fault: string, seed: number, body: (swarm: {
  dir: string; boot: string; validator: Awaited<ReturnType<typeof startValidator>>; user: Awaited<ReturnType<typeof createNode>>;
  host: (span: string) => Promise<Worker>; cheater: string; alone: RlResult; options: Omit<RlOptions, 'policy'>;
}) => Promise<void>): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'tl-rl-fault-'));
  const model = createModel(config, { seed: 5 });
  model.tokenizer = tok;
  await saveModel(model, dir);
  // overlapped: the rollouts' own log-probabilities are π_old, so those of a discarded draw must not stay
  const options = { task: ascii, steps: 3, prompts: 2, groupSize: 4, preset: 'dapo' as const, evalEvery: 0, seed, overlap: true as const };
  const local = await loadModel(dir);
  adaptModel(local, LORA, { seed: 13 });
  local.tokenizer = tok;
  const alone = await rl({ ...options, policy: localPolicy(local, { lr: 5e-2, microBatches: 2, totalSteps: 10, warmupSteps: 0 }) });
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const hosts: Worker[] = [];
  const host = async (span: string, faulty?: string) => {
    const w = await startWorker({ bootstrap: boot, host: [parseHostSpec(`tiny=${dir}:${span}`)], ...(faulty ? { fault: parseFault(faulty) } : {}) });
    hosts.push(w);
    return w;
  };
  const user = await createNode();
  try {
    const [, faulty] = await Promise.all([host('0-0'), host('1-1', fault), host('2-2')]);
    await body({ dir, boot, validator, user, host: (span) => host(span), cheater: faulty.node.peerId.toString(), alone, options });
  } finally {
    await user.stop();
    await Promise.all(hosts.map((h) => h.stop()));
    await validator.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('GRPO\'s loop', () => {
  setBackend('js');

  for (const overlap of [false, true]) {
    test(`in one process${overlap ? ', rollouts drawn before the last step\'s update (one step stale, importance-weighted)' : ''}: the policy `
      + 'learns what the reward asks, its mean reward from 0.4 to 0.9 and more', async () => {
      const model = createModel(config, { seed: 5 });
      model.tokenizer = tok;
      const policy = localPolicy(model, { lr: 1e-2, microBatches: 2 });
      const result = await rl({ task: ascii, policy, steps: 25, prompts: 8, groupSize: 8, preset: 'dapo', evalEvery: 0, seed: 3, overlap });
      const rewards = result.steps.map((s) => s.reward);
      const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
      process.stderr.write(`${overlap ? 'overlapped' : 'on-policy'}: rewards by step ${rewards.map((r) => r.toFixed(2)).join(' ')}\n`);
      assert.ok(mean(rewards.slice(0, 3)) < 0.5, `a random policy's reward: ${rewards.slice(0, 3)}`);
      assert.ok(mean(rewards.slice(-3)) > 0.9, `after 25 steps: ${rewards.slice(-3)}`);
      assert.deepEqual(result.steps.map((s) => s.stale), result.steps.map((s) => (overlap && s.step > 1 ? 1 : 0)));
      if (overlap) assert.ok(result.steps.some((s) => s.clipped > 0), 'stale rollouts: some ratios clipped');
    });
  }

  describe('across three hosts of a hosted model: an adapter trained by GRPO', () => {
    let dir: string;
    let validator: Awaited<ReturnType<typeof startValidator>>;
    let hosts: Worker[];
    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'tl-rl-'));
      const model = createModel(config, { seed: 5 });
      model.tokenizer = tok;
      await saveModel(model, dir);
      validator = await startValidator();
      const boot = validator.node.getMultiaddrs()[0].toString();
      hosts = await Promise.all(['0-0', '1-1', '2-2'].map((span) => startWorker({ bootstrap: boot, host: [parseHostSpec(`tiny=${dir}:${span}`)] })));
    });
    after(async () => {
      await Promise.all(hosts.map((h) => h.stop()));
      await validator.stop();
      rmSync(dir, { recursive: true, force: true });
    });

    const modes = {
      'on-policy': { overlap: false, apart: false },
      'overlapped (rollouts a step stale)': { overlap: true, apart: false },
      'overlapped, the rollouts drawn beside each step by a second job of the adapter (given the factors before each draw)': { overlap: true, apart: true },
    };
    for (const [mode, { overlap, apart }] of Object.entries(modes)) {
      test(`${mode}: one process's rollouts, rewards and losses, step for step; the hosts' factors a step further after each step`, async () => {
        const STEPS = 4;
        const options = { task: ascii, steps: STEPS, prompts: 4, groupSize: 4, preset: 'dapo' as const, evalEvery: 0, seed: 9, overlap };
        const local = await loadModel(dir);
        adaptModel(local, LORA, { seed: 13 });
        local.tokenizer = tok;
        const alone = await rl({ ...options, policy: localPolicy(local, { lr: 5e-2, microBatches: 2, totalSteps: 100, warmupSteps: 0 }) });

        const user = await createNode();
        const boot = validator.node.getMultiaddrs()[0].toString();
        const dm = await distribute(user, boot, dir, { training: true, hosted: 'tiny', adapter: { ...LORA, seed: 13 }, verify: { sampleRate: 0.5 } });
        try {
          const hostIds = new Set(hosts.map((h) => h.node.peerId.toString()));
          assert.ok(dm.assignment.length === 3 && dm.assignment.every((a) => hostIds.has(a.peerId)), JSON.stringify(dm.assignment));
          const trainer = await dm.trainer({ optimizer: { lr: 5e-2 }, totalSteps: 100, warmupSteps: 0, microBatches: 2, schedule: '1f1b' });
          // each host's factors: the optimizer steps its section of the job has taken
          const versions = () => hosts.map((h) => [...h.jobs.values()].find((j) => j.jobId === dm.jobId)?.section?.training?.records.step);
          const seen: (number | undefined)[][] = [];
          // drawn apart: a job of the same adapter that does not train, over the same hosts
          const drawer = apart ? await distribute(user, boot, dir, { hosted: 'tiny', adapter: { ...LORA, seed: 13 }, verify: { sampleRate: 0.5 } }) : null;
          const events: string[] = [];
          const rollouts = drawer && {
            generateBatch: (p: number[][], o: GenerateOptions) => (events.push('draw'), drawer.generateBatch(p, o)),
            setAdapter: (f: Map<string, Tensor>) => drawer.setAdapter(f),
          };
          const stepping = { step: async (b: TrainingBatch) => trainer.step(b).finally(() => events.push('stepped')), get stepCount() {
            return trainer.stepCount;
          } };
          const policy = jobPolicy(dm, stepping, tok, rollouts ? { rollouts } : {});
          const swarm = await rl({ ...options, policy, onStep: () => seen.push(versions()) }).finally(() => drawer?.close());
          // each next step's rollouts began before the step before them ended: they ran beside it
          if (drawer) assert.deepEqual(events, ['draw', 'draw', 'stepped', 'draw', 'stepped', 'draw', 'stepped', 'stepped']);
          if (drawer) assert.ok(drawer.verification!.checked > 0 && drawer.verification!.failed === 0, JSON.stringify(drawer.verification));
          assert.deepEqual(swarm.steps.map((s) => s.reward), alone.steps.map((s) => s.reward));
          assert.deepEqual(swarm.steps.map((s) => s.loss), alone.steps.map((s) => s.loss));
          assert.deepEqual(swarm.steps.map((s) => s.stale), swarm.steps.map((s) => (overlap && s.step > 1 ? 1 : 0)));
          assert.deepEqual(seen, Array.from({ length: STEPS }, (_, i) => [i + 1, i + 1, i + 1]));
          // the validator's dashboard shows the job as reinforcement learning, its last step's reward beside the loss
          const last = swarm.steps.at(-1)!;
          const { value: shown } = await waitFor('the job on the dashboard', async () => {
            const jobs = parseOverview(await request(user, multiaddr(boot), { type: 'overview' })).jobs;
            return jobs.find((j) => j.jobId === dm.jobId && j.step === STEPS && j.reward === last.reward);
          }, 10_000);
          assert.equal(shown.kind, 'rl');
          assert.equal(shown.loss, last.loss);
          assert.equal(shown.rolloutTokensPerSecond, last.rolloutTokensPerSecond, 'the last rollouts\' tokens a second');
          const summary = await dm.settle();
          assert.ok(summary && summary.checked > 0 && summary.failed === 0, JSON.stringify(summary));
          process.stderr.write(`${apart ? 'beside' : overlap ? 'overlapped' : 'on-policy'}: rewards ${swarm.steps.map((s) => s.reward.toFixed(3)).join(' ')} on both; `
            + `the hosts' factors at steps ${seen.map((v) => v[0]).join(', ')}; ${summary.checked} records re-run by the validator\n`);
        } finally {
          await dm.close();
          await user.stop();
        }
      });
    }

    test('with a KL term to the base (β 0.04): the base\'s log-probabilities from a session of the model its hosts serve for '
      + 'everyone; one process\'s rewards and losses, step for step', async () => {
      const options = { task: ascii, steps: 3, prompts: 4, groupSize: 4, preset: 'dapo' as const, grpo: { beta: 0.04 }, evalEvery: 0, seed: 4 };
      const local = await loadModel(dir);
      adaptModel(local, LORA, { seed: 13 });
      local.tokenizer = tok;
      const reference = await loadModel(dir);
      const trainerOptions = { microBatches: 2, totalSteps: 100, warmupSteps: 0 };
      const alone = await rl({ ...options, policy: localPolicy(local, { lr: 5e-2, ...trainerOptions, reference }) });

      const user = await createNode();
      const boot = validator.node.getMultiaddrs()[0].toString();
      const dm = await distribute(user, boot, dir, { training: true, hosted: 'tiny', adapter: { ...LORA, seed: 13 }, verify: { sampleRate: 0.5 } });
      const base = await HostedModel.open(user, boot, 'tiny', { ends: dir, verify: { mode: 'reexec', sampleRate: 1 } });
      try {
        const trainer = await dm.trainer({ optimizer: { lr: 5e-2 }, ...trainerOptions });
        const swarm = await rl({ ...options, policy: jobPolicy(dm, trainer, tok, { reference: base }) });
        assert.deepEqual(swarm.steps.map((s) => s.reward), alone.steps.map((s) => s.reward));
        assert.deepEqual(swarm.steps.map((s) => s.loss), alone.steps.map((s) => s.loss));
        assert.ok(base.verification.checked > 0 && base.verification.failed === 0, JSON.stringify(base.verification));
        // the rollouts' KL to the base, the same figure in both, on the validator's dashboard beside the reward
        const kls = swarm.steps.map((s) => s.kl!);
        assert.deepEqual(kls, alone.steps.map((s) => s.kl));
        assert.ok(kls[0] < 1e-6 && kls.slice(1).every((k) => k > kls[0]), `KL about 0 at the start (the adapter's B is 0), then above: ${kls}`);
        await waitFor('the KL on the dashboard', async () => {
          const jobs = parseOverview(await request(user, multiaddr(boot), { type: 'overview' })).jobs;
          return jobs.find((j) => j.jobId === dm.jobId && j.kl === kls.at(-1));
        }, 10_000);
        process.stderr.write(`KL to the hosted base: ${kls.map((k) => k.toExponential(2)).join(' ')}, losses ${swarm.steps.map((s) => s.loss.toFixed(5)).join(' ')} on both; `
          + `${base.verification.checked} of the base's steps re-run\n`);
      } finally {
        await base.close();
        await dm.close();
        await user.stop();
      }
    });
  });

  test('a host that computes with an int4 copy of the model it announces (--fault substitute:int4) is caught; its rollouts are discarded, '
    + 'the job goes on without it, and the run equals one process\'s', async () => {
    await withFaultyHost('substitute:int4', 1, async ({ dir, boot, user, host, cheater, alone, options }) => {
      const dm = await distribute(user, boot, dir, { training: true, hosted: 'tiny', adapter: { ...LORA, seed: 13 }, verify: { sampleRate: 1 } });
      try {
        assert.ok(dm.assignment.some((a) => a.peerId === cheater), JSON.stringify(dm.assignment));
        // an honest host of the cheater's blocks joins once the job is placed: the job's only way on without it
        const spare = await host('1-1');
        const trainer = await dm.trainer({ optimizer: { lr: 5e-2 }, totalSteps: 10, warmupSteps: 0, microBatches: 2 });
        // its records sign the hash of the int4 weights it computes with: what the validator checks is that they are not
        // the model's the job asked for (the manifest, fetched from the host and checked against the model's name)
        const swarm = await rl({ ...options, policy: jobPolicy(dm, trainer, tok) });
        const summary = await dm.settle();
        assert.ok(summary && summary.failed > 0, JSON.stringify(summary));
        assert.deepEqual(summary.flagged, [cheater]);
        // blocks 1-1 are the job's layers 2-2 (0 is the embedding)
        assert.equal(dm.assignment.find((a) => a.start === 2)?.peerId, spare.node.peerId.toString());
        // its rollouts were discarded and drawn again from the job without it: the run is one process's, bit for bit (js)
        assert.deepEqual(swarm.steps.map((s) => s.reward), alone.steps.map((s) => s.reward));
        assert.deepEqual(swarm.steps.map((s) => s.loss), alone.steps.map((s) => s.loss));
        process.stderr.write(`substitute:int4 host caught: ${summary.failed} of ${summary.checked} records failed, flagged ${cheater.slice(-6)}; `
          + `${summary.replayedSteps} steps replayed; rewards ${swarm.steps.map((s) => s.reward.toFixed(3)).join(' ')} as in one process\n`);
      } finally {
        await dm.close().catch(() => {});
      }
    });
  });

  test('a host of the rollouts\' job that keeps older factors (--fault stale-adapter) is left: the draw it served is made again on '
    + 'a host that takes them, nothing is slashed (the user\'s word against the host\'s), and the run equals one process\'s', async () => {
    await withFaultyHost('stale-adapter', 2, async ({ dir, boot, user, host, cheater: stale, alone, options, validator }) => {
      const job = { hosted: 'tiny', adapter: { ...LORA, seed: 13 } };
      const dm = await distribute(user, boot, dir, { ...job, training: true, verify: { sampleRate: 0.5 } });
      const drawer = await distribute(user, boot, dir, { ...job, verify: { sampleRate: 1 } });
      try {
        assert.ok(drawer.assignment.some((a) => a.peerId === stale), JSON.stringify(drawer.assignment));
        // an honest host of its blocks joins once both jobs are placed: the rollouts' job's way on without it
        const spare = await host('1-1');
        const trainer = await dm.trainer({ optimizer: { lr: 5e-2 }, totalSteps: 10, warmupSteps: 0, microBatches: 2 });
        const swarm = await rl({ ...options, policy: jobPolicy(dm, trainer, tok, { rollouts: drawer }) });
        const drawn = drawer.verification!;
        // left on the user's word (what factors it gave the host), not flagged
        assert.deepEqual(drawn.left, [stale]);
        assert.deepEqual(drawn.flagged, []);
        // blocks 1-1 are the job's layers 2-2 (0 is the embedding)
        assert.equal(drawer.assignment.find((a) => a.start === 2)?.peerId, spare.node.peerId.toString());
        // the training job, which loads its factors once, kept the host and passed every check
        const trained = await dm.settle();
        assert.ok(trained && trained.failed === 0 && dm.assignment.some((a) => a.peerId === stale), JSON.stringify(trained));
        const standing = validator.reputation.standing(stale);
        assert.ok(!standing.excluded && standing.failed === 0, `no evidence against it, none counted: ${JSON.stringify(standing)}`);
        assert.deepEqual(swarm.steps.map((s) => s.reward), alone.steps.map((s) => s.reward));
        assert.deepEqual(swarm.steps.map((s) => s.loss), alone.steps.map((s) => s.loss));
        process.stderr.write(`stale-adapter host left by the rollouts' job after ${drawn.checked} checks; `
          + `rewards ${swarm.steps.map((s) => s.reward.toFixed(3)).join(' ')} as in one process\n`);
      } finally {
        await drawer.close().catch(() => {});
        await dm.close().catch(() => {});
      }
    });
  });

  test('the built-in tasks\' rewards, and a task of one\'s own from a JS module; bad ones refused by name', async () => {
    const addition = rlTaskByName('addition', 1);
    const e = addition.test[0];
    assert.equal(await addition.reward(e.prompt, e.answer), 1);
    assert.equal(await addition.reward(e.prompt, `${e.answer}0`), 0);
    const json = rlTaskByName('json');
    const j = json.test[0];
    assert.equal(await json.reward(j.prompt, j.answer), 1);
    assert.equal(await json.reward(j.prompt, '{"a":1000,"b":"zz"}'), 0.5);
    assert.equal(await json.reward(j.prompt, '[1,2]'), 0.2);
    assert.equal(await json.reward(j.prompt, '{"a":'), 0);
    assert.throws(() => rlTaskByName('chess'), InvalidArgumentError);
    const dir = mkdtempSync(join(tmpdir(), 'tl-rl-task-'));
    try {
      writeFileSync(join(dir, 'mine.mjs'), 'export const prompts = ["x>", "y>"];\nexport const maxNewTokens = 3;\n'
      + 'export async function reward(prompt, completion) { return completion === prompt[0] ? 1 : 0; }\n');
      const mine = await loadTask(join(dir, 'mine.mjs'));
      assert.equal(mine.maxNewTokens, 3);
      assert.equal(await mine.reward('x>', 'x'), 1);
      writeFileSync(join(dir, 'bad.mjs'), 'export const prompts = ["x>"];\nexport function reward() { return "much"; }\n');
      await assert.rejects(async () => (await loadTask(join(dir, 'bad.mjs'))).reward('x>', ''), /not a finite number/);
      writeFileSync(join(dir, 'none.mjs'), 'export const prompts = [];\n');
      await assert.rejects(loadTask(join(dir, 'none.mjs')), /no reward/);
      await assert.rejects(loadTask(join(dir, 'missing.mjs')), /not found/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
