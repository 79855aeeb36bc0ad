// Issue #31: a user without a checkpoint pulls a hosted model's ends (embedding, final norm, head), config and tokenizer
// from a host (`tensorlink pull-ends`), checked against the model's manifest hash, and generates with them as one process.
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import type { Libp2p } from '@libp2p/interface';
import { byteLevelTokenizerJson, configToHF, generate, hfToGGUF, loadModel } from '../../src/models/index.ts';
import { createNode, type Handler, type HostedSpan, request, serveControl } from '../../src/p2p/index.ts';
import { HostedModel, pullEnds } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { measureCapabilities, modelFiles, modelHash, openModelWeights, parseHostSpec, startWorker } from '../../src/worker/index.ts';
import { endsHandlers } from '../../src/worker/ends-server.ts';
import type { JobTable } from '../../src/worker/jobs.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';

/**
 * A peer that announces itself a host of the model at `dir` (all its blocks) and answers the ends requests through
 * endsHandlers, with `tamper` changing its answers: a host that lies.
 */
async function lyingHost(
  validator: string, name: string, dir: string, tamper: (type: string, answer: Record<string, unknown>) => Record<string, unknown>,
  served = dir,
): Promise<Libp2p> {
  const weights = openModelWeights(dir, null);
  const hash = await modelHash(weights, modelFiles(dir));
  const span: HostedSpan = { name, hash, blocks: weights.config.layers, layers: [0, weights.config.layers - 1], format: 'f32', state: 'online' };
  weights.close();
  const jobs = { values: () => [{ hosted: span }][Symbol.iterator]() } as unknown as JobTable;
  // it announces the model at `dir`, and serves the files at `served` beside its weights
  const honest = endsHandlers(jobs, () => ({ path: dir, files: modelFiles(served) }));
  const node = await createNode({ listen: ['/ip4/127.0.0.1/tcp/0'] });
  const handlers: Record<string, Handler> = {};
  for (const [type, handler] of Object.entries(honest)) handlers[type] = async (m, from) => tamper(type, await handler(m, from));
  await serveControl(node, handlers);
  const { multiaddr } = await import('@multiformats/multiaddr');
  await request(node, multiaddr(validator), {
    type: 'announce', roles: ['worker'], capabilities: measureCapabilities(), addrs: node.getMultiaddrs().map(String), proximity: {}, hosts: [span],
  });
  return node;
}

describe('pull-ends', () => {
  setBackend('js');
  const root = mkdtempSync(join(tmpdir(), 'tl-pull-ends-'));
  after(() => rmSync(root, { recursive: true, force: true }));
  const ref = readHFReference('llama3');
  // the llama3 fixture with a tokenizer beside it
  const model = join(root, 'llama3');
  mkdirSync(model);
  for (const f of ['config.json', 'model.safetensors']) copyFileSync(join(ref.dir, f), join(model, f));
  writeFileSync(join(model, 'tokenizer.json'), JSON.stringify(byteLevelTokenizerJson()));
  writeFileSync(join(model, 'tokenizer_config.json'), JSON.stringify({ model_max_length: 64 }));

  test('a user without a checkpoint pulls the ends from a host: bit for bit the original\'s, and generation as one process', async () => {
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const hosts = [
      await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${model}:0-0`)] }),
      await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${model}:1-1`)] }),
    ];
    const user = await createNode();
    try {
      const out = join(root, 'pulled');
      let progress = 0;
      const pulled = await pullEnds(user, validator.node.getMultiaddrs()[0], 'llama3', out, { onProgress: (done) => (progress = done) });
      assert.equal(pulled.dir, out);
      assert.match(pulled.hash, /^[0-9a-f]{64}$/);
      assert.ok(hosts.some((h) => h.node.peerId.toString() === pulled.host));
      assert.equal(progress, pulled.bytes);
      for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json']) {
        assert.deepEqual(readFileSync(join(out, f)), readFileSync(join(model, f)), `${f} as the host has it`);
      }
      // the ends only, bit for bit
      const mine = await loadModel(out, { part: 'ends' });
      const theirs = await loadModel(model, { part: 'ends' });
      const a = mine.hfStateDict();
      const b = theirs.hfStateDict();
      assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort());
      for (const [k, t] of b) assert.deepEqual(Buffer.from(a.get(k)!.data.buffer), Buffer.from(t.data.buffer), k);
      assert.ok(mine.tokenizer, 'the tokenizer came along');
      const full = readFileSync(join(model, 'model.safetensors')).byteLength;
      assert.ok(pulled.bytes < full, `only the ends travel: ${pulled.bytes} of ${full} bytes`);
      // generation with the pulled ends over the hosts equals one process
      const local = await loadModel(model);
      const options = { maxNewTokens: 12, temperature: 0, stopTokens: [] };
      const want = await generate(local, ref.prompt, options);
      const hosted = await HostedModel.open(user, validator.node.getMultiaddrs()[0], 'llama3', { ends: out });
      try {
        assert.deepEqual((await hosted.generate(ref.prompt, options)).tokens, want.tokens);
      } finally {
        await hosted.close();
      }
      // a non-empty directory is not written over
      await assert.rejects(pullEnds(user, validator.node.getMultiaddrs()[0], 'llama3', out), { name: 'InvalidArgumentError' });
      // a host sends its ends, never its blocks
      const target = hosts[0].node.getMultiaddrs()[0];
      await assert.rejects(request(user, target, { type: 'ends-chunk', model: 'llama3', weight: 'model.layers.0.self_attn.q_proj.weight', index: 0, offset: 0 }), {
        name: 'UnauthorizedError', message: /only the ends/,
      });
      await assert.rejects(request(user, target, { type: 'ends-manifest', model: 'other' }), { name: 'UnauthorizedError' });
      process.stderr.write(`pull-ends llama3: ${pulled.bytes} bytes of ends (of ${full}), bit for bit; generation over 2 hosts as one process\n`);
    } finally {
      await user.stop();
      await Promise.all(hosts.map((h) => h.stop()));
      await validator.stop();
    }
  });

  test('a GGUF host: its ends (dequantized to float32) and its tokenizer as tokenizer.json, as one process on the file', async () => {
    const gguf = join(root, 'llama3-q8_0.gguf');
    const original = await loadModel(model);
    const state = original.hfStateDict();
    await hfToGGUF(gguf, {
      config: configToHF(original.config), tokenizer: byteLevelTokenizerJson() as Record<string, unknown>, type: 'q8_0',
      weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape] })), read: (name) => state.get(name)!,
    });
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const host = await startWorker({ bootstrap: boot, host: [parseHostSpec(`q8=${gguf}`)] });
    const user = await createNode();
    try {
      const out = join(root, 'pulled-gguf');
      const pulled = await pullEnds(user, validator.node.getMultiaddrs()[0], 'q8', out);
      assert.ok(existsSync(join(out, 'tokenizer.json')), 'the GGUF\'s tokenizer as tokenizer.json');
      const a = (await loadModel(out, { part: 'ends' })).hfStateDict();
      const b = (await loadModel(gguf, { part: 'ends' })).hfStateDict();
      assert.deepEqual([...a.keys()].sort(), [...b.keys()].sort());
      for (const [k, t] of b) assert.deepEqual(Buffer.from(a.get(k)!.data.buffer), Buffer.from(t.data.buffer), k);
      const options = { maxNewTokens: 8, temperature: 0, stopTokens: [] };
      const want = await generate(await loadModel(gguf), ref.prompt, options);
      const hosted = await HostedModel.open(user, validator.node.getMultiaddrs()[0], 'q8', { ends: out });
      try {
        assert.deepEqual((await hosted.generate(ref.prompt, options)).tokens, want.tokens);
      } finally {
        await hosted.close();
      }
      process.stderr.write(`pull-ends from a GGUF host (Q8_0): ${pulled.bytes} bytes of ends, bit for bit the file's, generation as one process\n`);
    } finally {
      await user.stop();
      await host.stop();
      await validator.stop();
    }
  });

  // copies of the model with the same weights and one file beside them changed
  const variant = (what: string, change: (dir: string) => void) => {
    const dir = join(root, `variant-${what}`);
    mkdirSync(dir);
    for (const f of readdirSync(model)) copyFileSync(join(model, f), join(dir, f));
    change(dir);
    return dir;
  };
  const other = {
    tokenizer: variant('tokenizer', (dir) => {
      const tok = byteLevelTokenizerJson() as { model: { vocab: Record<string, number> } };
      const [a, b] = Object.keys(tok.model.vocab);
      [tok.model.vocab[a], tok.model.vocab[b]] = [tok.model.vocab[b], tok.model.vocab[a]];
      writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tok));
    }),
    config: variant('config', (dir) => {
      const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
      writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, rms_norm_eps: 0.5 }));
    }),
    template: variant('template', (dir) => {
      writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ model_max_length: 64, chat_template: '{{ messages }}' }));
    }),
  };

  test('the model\'s hash covers its weights and every file beside them: one changed, added or dropped is another model', async () => {
    const hash = async (dir: string) => {
      const weights = openModelWeights(dir, null);
      try {
        return await modelHash(weights, modelFiles(dir));
      } finally {
        weights.close();
      }
    };
    const base = await hash(model);
    assert.equal(await hash(variant('copy', () => {})), base, 'a copy has the same hash');
    const changed = await Promise.all([other.tokenizer, other.config, other.template].map(hash));
    const dropped = await hash(variant('dropped', (dir) => rmSync(join(dir, 'tokenizer_config.json'))));
    assert.equal(new Set([base, ...changed, dropped]).size, 5, 'each change is another hash');
  });

  test('a host whose chunk, manifest or files are not the announced model\'s is refused, naming it; the next host is asked', async () => {
    const cases: [string, (type: string, answer: Record<string, unknown>) => Record<string, unknown>, RegExp, string?][] = [
      ['a wrong chunk', (type, answer) => {
        if (type !== 'ends-chunk') return answer;
        const bytes = Buffer.from(answer.data as string, 'base64');
        bytes[0] ^= 1;
        return { ...answer, data: bytes.toString('base64') };
      }, /sent chunk 0 of '.*' with sha256/],
      ['a manifest of another model', (type, answer) => {
        if (type !== 'ends-manifest') return answer;
        const weights = (answer.weights as { name: string; hashes: string[] }[]).map((w, i) => (i === 0 ? { ...w, hashes: w.hashes.map(() => '0'.repeat(64)) } : w));
        return { ...answer, weights };
      }, /hashes to .*, not the announced/],
      // the files beside the weights are the model's too: one other than it lists, or others listed
      ['a config.json other than it lists', (type, answer) => {
        if (type !== 'ends-file') return answer;
        const bytes = Buffer.from(answer.data as string, 'base64');
        bytes[1] ^= 1;
        return { ...answer, data: bytes.toString('base64') };
      }, /sent a config\.json other than the model's/],
      ['another tokenizer', (_type, answer) => answer, /\(its weights and config\.json, tokenizer\.json, tokenizer_config\.json\) that hashes to .*, not the announced/, other.tokenizer],
      ['another config', (_type, answer) => answer, /that hashes to .*, not the announced/, other.config],
      ['a chat template added', (_type, answer) => answer, /that hashes to .*, not the announced/, other.template],
    ];
    for (const [what, tamper, message, served] of cases) {
      const validator = await startValidator();
      const boot = validator.node.getMultiaddrs()[0].toString();
      const liar = await lyingHost(boot, 'llama3', model, tamper, served);
      const user = await createNode();
      const out = join(root, `refused-${what.replaceAll(' ', '-')}`);
      try {
        await assert.rejects(pullEnds(user, validator.node.getMultiaddrs()[0], 'llama3', out), { name: 'VerificationError', message }, what);
        assert.equal(existsSync(out), false, `${what}: nothing is left behind`);
      } finally {
        await user.stop();
        await liar.stop();
        await validator.stop();
      }
    }
    // beside an honest host, a liar only costs a try: the ends come from the honest one
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const liar = await lyingHost(boot, 'llama3', model, cases[0][1]);
    const honest = await startWorker({ bootstrap: boot, host: [parseHostSpec(`llama3=${model}`)] });
    const user = await createNode();
    try {
      const pulled = await pullEnds(user, validator.node.getMultiaddrs()[0], 'llama3', join(root, 'beside-a-liar'));
      assert.equal(pulled.host, honest.node.peerId.toString());
    } finally {
      await user.stop();
      await honest.stop();
      await liar.stop();
      await validator.stop();
    }
  });
});
