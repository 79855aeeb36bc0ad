/**
 * The checks every family file (GPT-NeoX, Falcon, BLOOM) passes against its transformers fixture
 * (test/fixtures/hf/<name>/): logits, loss, every gradient under its checkpoint name, 24 greedy
 * tokens with the KV cache; its config's round trip through config.json; sections that chain to
 * the whole model bit for bit; left-padded batches under a key mask; save → load.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import {
  type CausalLM,
  configFromHF,
  configToHF,
  createModel,
  generate,
  generateBatch,
  KVCache,
  layersOfWeight,
  loadModel,
  LocalTrainer,
  type ModelConfig,
  saveModel,
} from '../../src/models/index.ts';
import { localPipeline, PipelineTrainer } from '../../src/pipeline/index.ts';
import { crossEntropy, noGrad, setBackend, tensor } from '../../src/tensor/index.ts';
import { checkpointGrads, readHFReference } from './hf-fixtures.ts';
import { relErr } from './weights.ts';

/** Registers the fixture's tests (the errors measured go to stderr). */
export function familyFixtureTests(name: string): void {
  setBackend('js');
  const ref = readHFReference(name);

  test(`${name}: logits, loss and every gradient equal transformers'`, async () => {
    const model = await loadModel(ref.dir);
    const logits = model.forward(ref.inputIds);
    assert.deepEqual([...logits.shape], [...ref.logits.shape]);
    const logitsErr = relErr(logits.data, ref.logits.data);
    const [b, t] = ref.inputIds.shape;
    const ids = ref.inputIds.data;
    const targets = tensor(Array.from({ length: b * t }, (_, i) => (i % t === t - 1 ? -100 : ids[i + 1])), [b, t], 'int32');
    const loss = crossEntropy(logits, targets);
    const lossErr = Math.abs(loss.item() - ref.loss) / Math.abs(ref.loss);
    loss.backward();
    const want = checkpointGrads(ref.grads, ref.checkpointKeys);
    const own = model.hfStateDict();
    assert.deepEqual([...own.keys()].sort(), [...ref.checkpointKeys].sort(), 'the model holds the checkpoint names');
    let gradErr = 0;
    for (const [key, p] of own) {
      const g = want.get(key);
      assert.ok(g, `${key}: transformers has its gradient`);
      assert.deepEqual([...p.grad!.shape], g.shape, key);
      const e = relErr(p.grad!.data, g.data);
      gradErr = Math.max(gradErr, e);
      assert.ok(e < 1e-3, `${key}: gradient ${e}`);
    }
    process.stderr.write(`${name}: logits ${logitsErr.toExponential(2)}, loss ${lossErr.toExponential(2)}, grads ${gradErr.toExponential(2)}\n`);
    assert.ok(logitsErr < 1e-4, `logits ${logitsErr}`);
    assert.ok(lossErr < 1e-4, `loss ${loss.item()} vs ${ref.loss}`);
  });

  test(`${name}: 24 greedy tokens with the KV cache equal transformers'`, async () => {
    const model = await loadModel(ref.dir);
    const { tokens } = await generate(model, ref.prompt, { maxNewTokens: ref.greedy.length, temperature: 0, stopTokens: [] });
    assert.deepEqual(tokens, ref.greedy);
  });

  test(`${name}: left-padded prompts under a key mask continue as alone`, async () => {
    const model = await loadModel(ref.dir);
    const short = ref.prompt.slice(7);
    const alone = (await generate(model, short, { maxNewTokens: 6, temperature: 0, stopTokens: [] })).tokens;
    const { tokens } = await generateBatch(model, [ref.prompt, short], { maxNewTokens: 6, temperature: 0, stopTokens: [] });
    assert.deepEqual(tokens[0], ref.greedy.slice(0, 6));
    assert.deepEqual(tokens[1], alone);
  });

  test(`${name}: the config round-trips through config.json`, () => {
    const config = configFromHF(ref.config);
    assert.deepEqual(configFromHF(JSON.parse(JSON.stringify(configToHF(config))) as Record<string, unknown>), config);
    assert.equal(configToHF(config).model_type, ref.config.model_type);
  });

  test(`${name}: every checkpoint name has its layer, and sections chain to the whole model bit for bit`, async () => {
    const model = await loadModel(ref.dir);
    const c = model.config;
    const total = c.layers + 3;
    for (const key of ref.checkpointKeys) assert.ok(layersOfWeight(c, key).length > 0, `${key} belongs to a layer`);
    const state = model.hfStateDict();
    const cuts: [number, number][] = [[0, 2], [2, total - 1], [total - 1, total]];
    const sections = cuts.map((range) => {
      const part = createModel(c, { section: range });
      for (const [k, p] of part.hfStateDict()) p.data.set(state.get(k)!.data);
      for (const [k] of part.hfStateDict()) assert.deepEqual(layersOfWeight(c, k).some((l) => l >= range[0] && l < range[1]), true, k);
      return part;
    });
    const ids = ref.inputIds;
    const whole = noGrad(() => model.forward(ids));
    const chained = noGrad(() => sections.reduce((x, s) => s.forward(x), ids));
    assert.deepEqual(chained.data, whole.data);
    // cached steps through the sections equal the whole model's cached steps
    const prompt = tensor(ref.prompt, [1, ref.prompt.length], 'int32');
    const next = tensor([ref.greedy[0]], [1, 1], 'int32');
    const cacheWhole = new KVCache(c.layers);
    const caches = sections.map(() => new KVCache(c.layers));
    const run = (x: typeof ids) => noGrad(() => sections.reduce((h, s, i) => s.forward(h, { cache: caches[i] }), x));
    noGrad(() => model.forward(prompt, { cache: cacheWhole }));
    run(prompt);
    assert.deepEqual(run(next).data, noGrad(() => model.forward(next, { cache: cacheWhole })).data);
  });

  test(`${name}: trained over 2 stages (1F1B, the ends at home) as one process, bit for bit`, async () => {
    const [b, t] = ref.inputIds.shape;
    const ids = ref.inputIds.data;
    const batch = {
      input: ref.inputIds,
      target: tensor(Array.from({ length: b * t }, (_, i) => (i % t === t - 1 ? -100 : ids[i + 1])), [b, t], 'int32'),
    };
    const options = { lr: 1e-3, totalSteps: 3, warmupSteps: 1, microBatches: 2 };
    const one = await loadModel(ref.dir);
    const local = new LocalTrainer(one, options);
    const model = await loadModel(ref.dir);
    const L = model.config.layers;
    const stages = localPipeline(model, [[1, 2], [2, L + 1]], { lr: options.lr });
    const pipeline = new PipelineTrainer(stages, { ...options, schedule: '1f1b' });
    for (let s = 0; s < 3; s++) assert.equal((await pipeline.step(batch)).loss, local.step(batch).loss, `step ${s + 1}`);
    const weights = new Map<string, ArrayLike<number>>();
    for (const h of stages.flatMap((st) => st.replicas)) for (const [n, w] of await h.weights()) weights.set(n, w.data);
    for (const [n, p] of one.hfStateDict()) assert.deepEqual(weights.get(n), p.data, n);
  });

  test(`${name}: save → load round-trips bit for bit`, async () => {
    const model = await loadModel(ref.dir);
    const out = mkdtempSync(join(tmpdir(), `tl-${name}-`));
    try {
      await saveModel(model, out, { maxShardBytes: 100_000 });
      const back = await loadModel(out);
      assert.deepEqual(back.config, model.config);
      for (const [k, p] of model.hfStateDict()) assert.deepEqual(back.hfStateDict().get(k)!.data, p.data, k);
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
}

/** A fresh model of `config` trains (its loss falls) and generates with and without the cache alike. */
export function smallModelTests(label: string, config: ModelConfig): void {
  test(`${label}: a new model's cached and uncached greedy steps agree, and one step of training moves every weight`, async () => {
    setBackend('js');
    const model: CausalLM = createModel(config, { seed: 3 });
    const prompt = [5, 9, 2, 7, 1];
    const { tokens } = await generate(model, prompt, { maxNewTokens: 5, temperature: 0, stopTokens: [] });
    const seq = [...prompt];
    for (let i = 0; i < 5; i++) {
      const logits = noGrad(() => model.forward(tensor(seq, [1, seq.length], 'int32')));
      const v = config.vocabSize;
      const last = logits.data.subarray((seq.length - 1) * v, seq.length * v);
      let best = 0;
      for (let j = 1; j < v; j++) if (last[j] > last[best]) best = j;
      seq.push(best);
    }
    assert.deepEqual(tokens, seq.slice(prompt.length));
    const ids = tensor([1, 2, 3, 4, 5, 6], [1, 6], 'int32');
    const loss = crossEntropy(model.forward(ids), tensor([2, 3, 4, 5, 6, -100], [1, 6], 'int32'));
    loss.backward();
    for (const [k, p] of model.hfStateDict()) assert.ok(p.grad && p.grad.data.some((g) => g !== 0), `${k} has a gradient`);
  });
}
