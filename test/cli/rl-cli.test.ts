// Issue #51 through the CLI: `tensorlink rl --model NAME --bootstrap ADDR` over three host processes of a model hosted
// for everyone. The user pulls the model's ends, trains a LoRA adapter over the hosts with GRPO on a task of its own (a
// JS module), the hosts generating the rollouts with the adapter of the last step; the reward rises, and the validator's
// re-runs of the job's records all pass; a KL term keeps it near the model as the hosts serve it, and a second job of
// the adapter draws each step's rollouts beside the step before. In this process the same command runs on the
// checkpoint directory.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { byteLevelTokenizerJson, createModel, HFTokenizer, llamaConfig, saveModel } from '../../src/models/index.ts';
import { type Running, startNode } from '../helpers/processes.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

/** A reward a language model's first steps aim at: the share of a completion's characters that are printable ASCII. */
const TASK = `export const prompts = Array.from({ length: 50 }, (_, i) => String.fromCharCode(97 + (i % 26), 97 + ((i * 7) % 26)) + '>');
export const maxNewTokens = 4;
export function reward(prompt, completion) {
  const chars = [...completion];
  return chars.length === 0 ? 0 : chars.filter((c) => c.charCodeAt(0) >= 32 && c.charCodeAt(0) < 127).length / chars.length;
}
`;

interface RlJson {
  steps: { step: number; reward: number; stale: number }[];
  verification?: { checked: number; failed: number; flagged: string[] } | null;
  rollouts?: { jobId: string; verification: { checked: number; failed: number } };
  where: string;
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

describe('tensorlink rl', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-rl-cli-'));
  const nodes: Running[] = [];
  after(() => {
    for (const n of nodes) if (n.child.exitCode === null) n.child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  });

  test('--model NAME --bootstrap: GRPO over three host processes raises the reward; every record the validator re-ran passes', async (t) => {
    const config = llamaConfig({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, kvHeads: 2, intermediate: 64, maxPositions: 32 });
    const model = createModel(config, { seed: 5 });
    // a trained model's head, not a fresh one's (0.02 a weight): its logits span what a policy can be moved across
    for (const [name, w] of model.stateDict()) if (/lm_head|embed_tokens/.test(name)) w.data.forEach((v, i, a) => (a[i] = 30 * v));
    model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
    const base = join(dir, 'tiny');
    await saveModel(model, base);
    const task = join(dir, 'ascii.mjs');
    writeFileSync(task, TASK);

    const validator = await startNode(['validator', '--backend', 'js']);
    nodes.push(validator);
    const boot = validator.addrs[0];
    for (const span of ['0-0', '1-1', '2-2']) nodes.push(await startNode(['worker', '--bootstrap', boot, '--backend', 'js', '--host', `tiny=${base}:${span}`]));
    // a KL term to the base: over the hosts, its log-probabilities from a session of the model as they serve it; each
    // step's rollouts one step stale: over the hosts, drawn beside the step before by a second job of the adapter
    const grpo = ['--task', task, '--steps', '14', '--prompts', '8', '--group', '8', '--lr', '3e-2', '--preset', 'dapo', '--beta', '0.01', '--seed', '3']
      .concat(['--overlap'])
      .concat(['--backend', 'js', '--json']);
    const r = spawnSync(process.execPath, [BIN, 'rl', '--model', 'tiny', '--bootstrap', boot, '--verify-rate', '0.25', ...grpo], {
      encoding: 'utf8', timeout: 240_000,
    });
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout) as RlJson;
    const rewards = out.steps.map((s) => s.reward);
    assert.equal(out.where, 'hosted tiny');
    assert.ok(mean(rewards.slice(-3)) > mean(rewards.slice(0, 3)) + 0.2, `the reward rises: ${rewards.map((x) => x.toFixed(2)).join(' ')}`);
    assert.ok(out.verification && out.verification.checked > 0 && out.verification.failed === 0 && out.verification.flagged.length === 0,
      JSON.stringify(out.verification));
    assert.match(r.stderr, /a LoRA adapter \(r 8\) over tiny as its hosts serve it/);
    assert.match(r.stderr, /GRPO \(dapo, KL β 0\.01\)/);
    assert.match(r.stderr, /the rollouts beside each step: a second job of the adapter over 3 hosts/);
    const drawn = out.rollouts?.verification;
    assert.ok(drawn && drawn.checked > 0 && drawn.failed === 0, JSON.stringify(out.rollouts));

    // the same command in this process, on the checkpoint directory with the same adapter and seeds: the same rewards
    const local = spawnSync(process.execPath, [BIN, 'rl', '--model', base, '--adapter', 'lora:r=8,alpha=16', ...grpo], { encoding: 'utf8', timeout: 240_000 });
    assert.equal(local.status, 0, local.stderr);
    assert.deepEqual((JSON.parse(local.stdout) as RlJson).steps.map((s) => s.reward), rewards);
    t.diagnostic(`rewards over the hosts, and in one process: ${rewards.map((x) => x.toFixed(2)).join(' ')}; `
      + `${out.verification.checked} records re-run by the validator, 0 failed`);
  });
});
