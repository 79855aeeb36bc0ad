// Activation commitments across floats (#47): a host on webgpu (SwiftShader here, a GPU where there is one) and a host
// on ort serve a hosted model; the validator checks every chunk they commit to by one prefill on its own CPU backend.
// Their float results differ from the validator's in low bits, and no honest chunk fails: 0 false positives in ≥ 200.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { multiaddr } from '@multiformats/multiaddr';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { Generator, setBackend } from '../../src/tensor/index.ts';
import { HostedModel } from '../../src/user/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

const ref = readHFReference('llama3');
/** 16 prompts of 60 tokens and 5 new ones: 64 positions, so each row closes chunks 0 and 1 on each host. */
const ROWS = 16;
const PROMPT = 60;
const NEW = 5;
const SESSIONS = 4;

describe('commitments of a webgpu host and an ort host, checked on the validator\'s CPU', () => {
  let swarm: LocalSwarm | null = null;
  before(async () => {
    setBackend('js');
    swarm = await localSwarm({
      workers: 2,
      threads: 1,
      handleSignals: false,
      workerArgs: [
        ['--backend', 'webgpu', '--gpu-memory', '1GiB', '--host', `llama3=${ref.dir}:0-0`],
        ['--backend', 'ort', '--host', `llama3=${ref.dir}:1-1`],
      ],
    });
  });
  after(async () => {
    await swarm?.close();
  });

  test(`${SESSIONS} sessions of ${ROWS} rows: every committed chunk checked, none fails`, async () => {
    const model = await HostedModel.open(swarm!.user.node, multiaddr(swarm!.bootstrap), 'llama3', { ends: ref.dir, verify: { sampleRate: 1, tailRate: 0 } });
    try {
      const rng = new Generator(47);
      const vocab = Number(ref.config.vocab_size);
      for (let s = 0; s < SESSIONS; s++) {
        const token = () => 3 + Math.floor(rng.uniform() * (vocab - 3));
        const prompts = Array.from({ length: ROWS }, () => Array.from({ length: PROMPT }, token));
        const outs = await model.generateBatch(prompts, { maxNewTokens: NEW, temperature: 0, stopTokens: [] });
        assert.equal(outs.length, ROWS);
      }
      const v = model.verification;
      assert.deepEqual(v.flagged, [], 'no honest host flagged');
      assert.equal(v.failed, 0);
      assert.equal(v.chunks, SESSIONS * ROWS * 2 * 2, 'every chunk of both hosts checked');
      assert.ok(v.chunks >= 200);
      const worst = JSON.stringify(v.worst);
      process.stderr.write(`commitments across webgpu and ort: ${v.chunks} chunks checked in ${v.checked} checks, 0 failed; the largest differences: ${worst}\n`);
    } finally {
      await model.close();
    }
  });
});
