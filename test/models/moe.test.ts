import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { initModel } from '../../src/cli/commands/init-model.ts';
import type { Output } from '../../src/cli/output.ts';
import { configFromHF, configToHF, createModel, generate, loadModel, type ModelConfig, modelLayers, mixtralConfig, qwen3MoeConfig } from '../../src/models/index.ts';
import { topKIndices } from '../../src/models/moe.ts';
import { crossEntropy, noGrad, setBackend, tensor } from '../../src/tensor/index.ts';
import { familyFixtureTests } from '../helpers/family-checks.ts';

/** A new model's cached greedy steps equal its uncached ones, and training reaches every expert a token ran. */
function smallMoeTests(label: string, config: ModelConfig): void {
  test(`${label}: cached and uncached greedy steps agree; the experts run get gradients`, async () => {
    setBackend('js');
    const model = createModel(config, { seed: 3 });
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
    const ids = tensor(Array.from({ length: 32 }, (_, i) => (i * 7) % config.vocabSize), [2, 16], 'int32');
    const loss = crossEntropy(model.forward(ids), tensor(Array.from({ length: 32 }, (_, i) => (i * 7 + 7) % config.vocabSize), [2, 16], 'int32'));
    loss.backward();
    const state = model.hfStateDict();
    let experts = 0;
    for (const [k, p] of state) {
      if (/\.experts\.\d+\./.test(k)) {
        if (p.grad) experts++;
        continue;
      }
      assert.ok(p.grad && p.grad.data.some((g) => g !== 0), `${k} has a gradient`);
    }
    assert.ok(experts > 0, 'some experts ran');
  });
}

describe('Mixtral and Qwen3-MoE (sparse MoE: router, top-k, norm_topk_prob, per-expert weights)', () => {
  familyFixtureTests('mixtral');
  familyFixtureTests('qwen3_moe');
  smallMoeTests('Mixtral top-2 of 3, GQA, a window', mixtralConfig({ vocabSize: 40, hidden: 32, heads: 4, kvHeads: 2, layers: 2, maxPositions: 32, experts: 3, topK: 2, slidingWindow: 4 }));
  smallMoeTests('Qwen3-MoE top-1 of 4 unnormalised, every other block sparse', qwen3MoeConfig({
    vocabSize: 40, hidden: 32, heads: 4, layers: 2, maxPositions: 32, experts: 4, topK: 1, normTopK: false, decoderSparseStep: 2,
  }));
  smallMoeTests('Qwen3-MoE top-3 of 4 unnormalised, a dense block, biases', qwen3MoeConfig({
    vocabSize: 40, hidden: 32, heads: 4, kvHeads: 1, layers: 3, maxPositions: 32, experts: 4, topK: 3, normTopK: false,
    mlpOnlyLayers: [1], attentionBias: true, intermediate: 48, moeIntermediate: 16,
  }));

  test('top-k as torch.topk: largest first, ties to the lower index', () => {
    assert.deepEqual([...topKIndices([0.1, 0.5, 0.2, 0.5, 0.3, 0.3, 0.2, 0.2], 2, 4, 2)], [1, 3, 0, 1]);
  });

  test('configs round-trip through config.json, and what is not built is refused naming the field', () => {
    const configs: ModelConfig[] = [
      mixtralConfig({ slidingWindow: 64, ropeScaling: { type: 'linear', factor: 2 } }),
      qwen3MoeConfig({ decoderSparseStep: 2, mlpOnlyLayers: [0], slidingWindow: 16, tieWordEmbeddings: true }),
    ];
    for (const c of configs) assert.deepEqual(configFromHF(JSON.parse(JSON.stringify(configToHF(c))) as Record<string, unknown>), c);
    const mixtral = { model_type: 'mixtral', vocab_size: 10, hidden_size: 8, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, intermediate_size: 4 };
    const qwen = { model_type: 'qwen3_moe', vocab_size: 10, hidden_size: 8, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, num_experts: 4 };
    const refused = (raw: Record<string, unknown>, word: string) =>
      assert.throws(() => configFromHF(raw), (e: Error) => e.name === 'InvalidArgumentError' && e.message.includes(word) && !e.message.includes('\n'));
    refused({ ...mixtral, output_router_logits: true }, 'output_router_logits');
    refused({ ...mixtral, router_jitter_noise: 0.1 }, 'router_jitter_noise');
    refused({ ...mixtral, hidden_act: 'gelu' }, 'hidden_act');
    refused({ ...mixtral, num_experts_per_tok: 9 }, 'num_experts_per_tok');
    refused({ ...qwen, output_router_logits: true }, 'output_router_logits');
    refused({ ...qwen, mlp_only_layers: [2] }, 'mlp_only_layers');
    refused({ ...qwen, rope_scaling: { rope_type: 'hyperbolic', factor: 2 } }, 'hyperbolic');
    // defaults as transformers' config classes: Mixtral's 8 kv heads and 8 experts, Qwen3-MoE's 128 experts unnormalised
    const m = configFromHF({ ...mixtral, hidden_size: 16, num_attention_heads: 8, num_key_value_heads: undefined });
    assert.ok(m.arch === 'mixtral' && m.kvHeads === 8 && m.experts === 8 && m.topK === 2 && m.ropeTheta === 1e6 && m.slidingWindow === undefined);
    const q = configFromHF({ ...qwen, num_attention_heads: 4, num_key_value_heads: 4, use_sliding_window: false, sliding_window: 8 });
    assert.ok(q.arch === 'qwen3_moe' && !q.normTopK && q.slidingWindow === undefined && q.headDim === 2);
  });

  test('a block profile counts every expert\'s parameters and the top-k experts\' FLOPs', () => {
    const c = mixtralConfig({ vocabSize: 40, hidden: 32, heads: 4, kvHeads: 2, layers: 2, experts: 8, topK: 2, intermediate: 64 });
    const block = modelLayers(c)[1].profile();
    const attention = 2 * 32 + 32 * 32 + 2 * 32 * 16 + 32 * 32;
    const expert = 3 * 32 * 64;
    assert.equal(block.params, attention + 8 * 32 + 8 * expert);
    assert.equal(block.flopsPerToken, 2 * (attention + 8 * 32 + 2 * expert));
    assert.equal(createModel(c).hfStateDict().get('model.layers.1.block_sparse_moe.experts.7.w2.weight')?.shape.join(), '32,64');
    const blockParams = [...createModel(c).hfStateDict()].filter(([k]) => k.startsWith('model.layers.0.')).reduce((n, [, p]) => n + p.size, 0);
    assert.equal(block.params, blockParams);
    // Qwen3-MoE's dense blocks count their SwiGLU
    const q = qwen3MoeConfig({
      vocabSize: 40, hidden: 32, heads: 4, layers: 2, experts: 4, topK: 1, decoderSparseStep: 2, intermediate: 48, moeIntermediate: 16,
    });
    const [dense, sparse] = [1, 2].map((i) => modelLayers(q)[i].profile());
    const qAttention = 2 * 32 + 4 * 32 * 32 + 2 * 8;
    assert.equal(dense.params, qAttention + 3 * 32 * 48);
    assert.equal(sparse.params, qAttention + 4 * 32 + 4 * 3 * 32 * 16);
    assert.equal(sparse.flopsPerToken, 2 * (qAttention + 4 * 32 + 3 * 32 * 16));
  });

  test('init-model --arch mixtral|qwen3_moe writes a model that loads and generates', async () => {
    const root = mkdtempSync(join(tmpdir(), 'tl-moe-init-'));
    try {
      for (const arch of ['mixtral', 'qwen3_moe']) {
        const dir = join(root, arch);
        const out: Output = { json: true, info: () => {}, progress: () => {}, result: () => {} };
        await initModel({ 'arch': arch, 'layers': '2', 'hidden': '32', 'heads': '4', 'kv-heads': '2', 'out': dir }, out);
        const model = await loadModel(dir);
        assert.equal(model.config.arch, arch);
        const { tokens } = await generate(model, [72, 105], { maxNewTokens: 3, temperature: 0, stopTokens: [] });
        assert.equal(tokens.length, 3);
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
