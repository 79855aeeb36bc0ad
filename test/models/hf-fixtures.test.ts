// Issue #29's acceptance: every Hugging Face fixture (test/fixtures/hf/, made by transformers
// itself) either loads and equals transformers (logits, loss, every gradient under its checkpoint
// name, 24 greedy tokens with the KV cache; and the same tokens distributed over 3 worker
// processes, the user holding only the ends), or is refused with a one-line error that names its
// model_type or the field. A fixture that loads and then differs fails.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { localSwarm, type LocalSwarm } from '../../src/swarm/index.ts';
import { type CausalLM, generate, loadConfig, loadModel, partBytes } from '../../src/models/index.ts';
import type { RopeSpec } from '../../src/models/rope.ts';
import type { Module } from '../../src/nn/index.ts';
import { crossEntropy, setBackend, tensor } from '../../src/tensor/index.ts';
import { checkpointGrads, configNames, HF_FIXTURES, hfFixtureNames, readHFReference } from '../helpers/hf-fixtures.ts';
import { relErr } from '../helpers/weights.ts'; // max |a − b| / max |b|: the issue's measure

/** What works today and must stay equal. */
const MUST_LOAD = ['gpt2', 'llama', 'qwen2'];

/**
 * A reference made from a model that was not what transformers loads from its checkpoint: make_hf_fixtures.py
 * round-trips the whole model through bfloat16 (model.to(bf16).to(f32)), which rounds the rotary's inv_freq buffer
 * too, while from_pretrained keeps that buffer in float32 in any dtype (transformers issue #30709), as the project
 * does. Such a fixture is checked twice: as loaded, within what that rounding explains; and then, with the rotary's
 * frequencies held in bfloat16 as the reference's model held them, at the issue's strict bar.
 */
const CAST_WHOLE: Record<string, { asLoaded: number }> = {
  'llama3-bf16-sharded': { asLoaded: 5e-3 },
};

/** Holds every block's rotary frequencies in bfloat16, as a transformers model cast whole with .to(bfloat16). */
function holdRotaryInBfloat16(model: CausalLM): number {
  let blocks = 0;
  const visit = (m: unknown) => {
    const layer = m as { rope?: RopeSpec; ropeKey?: string };
    if (layer.rope && typeof layer.ropeKey === 'string') {
      const rope: RopeSpec = { ...layer.rope, invFreqDtype: 'bfloat16' };
      Object.assign(layer, { rope, ropeKey: JSON.stringify(rope) });
      blocks++;
    }
  };
  for (const [, m] of (model as unknown as Module).namedModules()) visit(m);
  return blocks;
}

/** The fixtures loadModel accepted (and that equalled transformers), for the distributed run. */
const accepted: string[] = [];

/** A refusal: a one-line InvalidArgumentError that names the model_type or one of the config's fields. */
function assertRefusal(err: unknown, config: Record<string, unknown>, what: string): string {
  assert.ok(err instanceof Error, `${what}: ${String(err)}`);
  assert.equal(err.name, 'InvalidArgumentError', `${what}: ${err.name}: ${err.message}`);
  assert.ok(!err.message.includes('\n'), `${what}: one line: ${JSON.stringify(err.message)}`);
  const names = configNames(config);
  assert.ok(names.some((n) => err.message.includes(n)), `${what}: '${err.message}' names none of ${names.join(', ')}`);
  return err.message;
}

describe('Hugging Face fixtures equal transformers, or are refused in one line', () => {
  setBackend('js');
  for (const name of hfFixtureNames()) {
    test(name, async () => {
      const ref = readHFReference(name);
      let model: CausalLM;
      try {
        model = await loadModel(ref.dir);
      } catch (err) {
        const message = assertRefusal(err, ref.config, name);
        process.stderr.write(`${name.padEnd(20)} refused: ${message}\n`);
        assert.ok(!MUST_LOAD.includes(name), `${name} worked before: ${message}`);
        return;
      }
      const cast = CAST_WHOLE[name];
      if (cast) {
        const asLoaded = relErr(model.forward(ref.inputIds).data, ref.logits.data);
        process.stderr.write(`${name.padEnd(20)} as loaded, rotary in float32: logits ${asLoaded.toExponential(2)}\n`);
        assert.ok(asLoaded < cast.asLoaded, `${name}: logits as loaded ${asLoaded}`);
        assert.equal(holdRotaryInBfloat16(model), loadConfig(ref.dir).layers, `${name}: blocks with a rotary`);
      }
      // logits for input_ids [2, 48]
      const logits = model.forward(ref.inputIds);
      assert.deepEqual([...logits.shape], [...ref.logits.shape], `${name}: logits shape`);
      const logitsErr = relErr(logits.data, ref.logits.data);
      // the loss with labels = input_ids, shifted: token t predicts t + 1, the mean over 2 × 47 targets
      const [b, t] = ref.inputIds.shape;
      const ids = ref.inputIds.data;
      const targets = tensor(Array.from({ length: b * t }, (_, i) => (i % t === t - 1 ? -100 : ids[i + 1])), [b, t], 'int32');
      const loss = crossEntropy(logits, targets);
      const lossErr = Math.abs(loss.item() - ref.loss) / Math.abs(ref.loss);
      loss.backward(undefined, { releaseActivations: true });
      // every parameter's gradient under its checkpoint name
      const want = checkpointGrads(ref.grads, ref.checkpointKeys);
      const own = model.hfStateDict();
      const gradErrs: string[] = [];
      let gradErr = 0;
      for (const [key, p] of own) {
        const g = want.get(key);
        if (!g) {
          gradErrs.push(`${key}: no gradient in transformers' run`);
          continue;
        }
        if (!p.grad || p.grad.shape.join() !== g.shape.join()) {
          gradErrs.push(`${key}: gradient [${p.grad?.shape ?? 'none'}], transformers' [${g.shape}]`);
          continue;
        }
        const e = relErr(p.grad.data, g.data);
        gradErr = Math.max(gradErr, e);
        if (!(e < 1e-3)) gradErrs.push(`${key}: ${e.toExponential(2)}`);
      }
      const unmatched = [...want.keys()].filter((k) => !own.has(k));
      // the 24 greedy tokens, with the KV cache
      const { tokens } = await generate(model, ref.prompt, { maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [] });
      const same = tokens.filter((tok, i) => tok === ref.greedy[i]).length;
      process.stderr.write(
        `${name.padEnd(20)} logits ${logitsErr.toExponential(2)}  loss ${lossErr.toExponential(2)}  grad ${gradErr.toExponential(2)} (${own.size} tensors)  tokens ${same}/${ref.greedy.length}\n`,
      );
      assert.ok(logitsErr < 1e-4, `${name}: logits relative error ${logitsErr}`);
      assert.ok(lossErr < 1e-4, `${name}: loss ${loss.item()} vs transformers' ${ref.loss}`);
      assert.deepEqual(gradErrs, [], `${name}: gradients`);
      assert.deepEqual(unmatched, [], `${name}: parameters transformers has that the model lacks`);
      assert.deepEqual(tokens, ref.greedy, `${name}: greedy tokens`);
      accepted.push(name);
    });
  }
});

describe('the accepted fixtures from their directories over 3 worker processes, the user holding only the ends', () => {
  let swarm: LocalSwarm | null = null;
  before(async () => {
    swarm = await localSwarm({ workers: 3, backend: 'js', threads: 1, handleSignals: false });
  });
  after(async () => {
    await swarm?.close();
  });

  test('the same 24 greedy tokens as transformers', async () => {
    assert.ok(accepted.length >= MUST_LOAD.length, `accepted: ${accepted.join(', ')}`);
    const failures: string[] = [];
    for (const name of accepted) {
      const ref = readHFReference(name);
      const config = loadConfig(ref.dir);
      try {
        const dm = await swarm!.user.distribute(ref.dir, { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 0 } });
        try {
          // the blocks (layers 1..L) over as many workers as there are blocks, up to 3; the ends stay home
          const sections = dm.assignment.map((a) => [a.start, a.end]).sort((x, y) => x[0] - y[0]);
          assert.equal(sections[0][0], 1, 'the embedding stays with the user');
          assert.equal(sections.at(-1)![1], config.layers + 1, 'the final norm and head stay with the user');
          assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, Math.min(3, config.layers), 'workers used');
          assert.equal(dm.source.heldBytes, partBytes(config, 'ends'), 'the user holds only the ends');
          const { tokens } = await dm.generate(ref.prompt, { maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [] });
          const same = tokens.filter((tok, i) => tok === ref.greedy[i]).length;
          process.stderr.write(`${name.padEnd(20)} distributed over ${sections.map(([s, e]) => `[${s}, ${e})`).join(' ')}: tokens ${same}/${ref.greedy.length}\n`);
          assert.deepEqual(tokens, ref.greedy, 'distributed greedy tokens');
        } finally {
          await dm.close();
        }
      } catch (err) {
        failures.push(`${name}: ${(err as Error).message.split('\n')[0]}`);
      }
    }
    assert.deepEqual(failures, []);
  });

  // issue #30: compact sections, each worker packing its own once it has arrived, the user its ends
  for (const [name, quantize] of [['llama3', 'int4'], ['qwen3', 'int8']] as const) {
    test(`${name} at ${quantize} over the workers: the same logits and tokens as one process at ${quantize}, bit for bit (js)`, async () => {
      const ref = readHFReference(name);
      const local = await loadModel(ref.dir, { quantize });
      const want = await generate(local, ref.prompt, { maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [] });
      const dm = await swarm!.user.distribute(ref.dir, { strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 0 }, quantize });
      try {
        assert.ok(dm.source.heldBytes < partBytes(loadConfig(ref.dir), 'ends') / 3, `the user holds its ends at ${quantize}`);
        const { tokens } = await dm.generate(ref.prompt, { maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [] });
        assert.deepEqual(tokens, want.tokens);
        const ids = tensor([...ref.prompt, ...tokens], [1, ref.prompt.length + tokens.length], 'int32');
        assert.deepEqual((await dm.logits(ids)).data, local.forward(ids).data);
        process.stderr.write(`${name.padEnd(20)} at ${quantize} over the workers: ${tokens.length} tokens and the logits equal one process at ${quantize}\n`);
        await assert.rejects(() => dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 1 }), /frozen: it cannot train/);
      } finally {
        await dm.close();
      }
    });
  }
});

describe('what is not built is refused in one line', () => {
  /** A temp copy of the llama fixture with config.json edited. */
  async function refusalOf(edit: (config: Record<string, unknown>) => void): Promise<{ err: unknown; config: Record<string, unknown> }> {
    const dir = mkdtempSync(join(tmpdir(), 'tl-hf-refused-'));
    try {
      cpSync(join(HF_FIXTURES, 'llama'), dir, { recursive: true });
      const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
      edit(config);
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config, null, 2));
      const err = await loadModel(dir).then(() => null, (e: unknown) => e);
      return { err, config };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  test('an unknown model_type', async () => {
    const { err, config } = await refusalOf((c) => (c.model_type = 'not_a_family'));
    assertRefusal(err, config, 'unknown model_type');
    assert.match((err as Error).message, /not_a_family/);
  });

  test('an unimplemented rope_scaling type', async () => {
    const { err, config } = await refusalOf((c) => (c.rope_scaling = { rope_type: 'hyperbolic', factor: 2 }));
    assertRefusal(err, config, 'rope_scaling');
    assert.match((err as Error).message, /hyperbolic/);
  });
});
