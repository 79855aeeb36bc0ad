// Llama-style models in GGUF (src/models/checkpoints/gguf-model.ts, gguf-tokenizer.ts): names, the llama q/k permutation against
// convert_hf_to_gguf.py's reshape/swapaxes (brute force), a model written and read back giving the same logits bit
// for bit, Q4_0 blocks kept exact through the permutation, Llama 3's rope_freqs, Mistral's sliding window, the byte-level
// tokenizer, and a SentencePiece one with the file's add_bos_token followed.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { GGUFMeta, GGUFReader, writeGGUF } from '../../src/io/gguf.ts';
import {
  ggufTensorName, GGUFModel, ggufToHF, hfTensorName, hfToGGUF, llama3RopeFactors, permuteRows, ropePermutation,
} from '../../src/models/checkpoints/gguf-model.ts';
import { tokenizerFromGGUF } from '../../src/models/checkpoints/gguf-tokenizer.ts';
import {
  byteLevelTokenizerJson, type CausalLM, configFromHF, configToHF, createModel, HFTokenizer, llamaConfig, type LlamaConfig, loadTokenizer,
  promptIds,
} from '../../src/models/index.ts';
import { writeModelFiles } from '../../src/models/checkpoints/hf.ts';
import { bytesToUnicode } from '../../src/models/tokenizer.ts';
import { noGrad, packMatrix, randn, tensor } from '../../src/tensor/index.ts';

const tmp = () => mkdtempSync(join(tmpdir(), 'tl-gguf-model-'));

/** LlamaModel.permute as numpy computes it: reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols). */
function numpyPermute(w: Float32Array, rows: number, cols: number, heads: number): Float32Array {
  const half = rows / heads / 2;
  const out = new Float32Array(w.length);
  let at = 0;
  // iterate the swapped array [heads, half, 2, cols] in C order, reading the source [heads, 2, half, cols]
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let s = 0; s < 2; s++) for (let c = 0; c < cols; c++) out[at++] = w[((h * 2 + s) * half + i) * cols + c];
    }
  }
  return out;
}

/** A small model of `type` with the byte-level tokenizer of `tensorlink init-model`. */
function small(overrides: Partial<LlamaConfig>): CausalLM {
  const config = llamaConfig({
    vocabSize: 260, hidden: 64, heads: 4, kvHeads: 2, layers: 2, intermediate: 96, maxPositions: 64, tieWordEmbeddings: true,
    bosTokenId: 256, eosTokenId: 256, ...overrides,
  });
  const model = createModel(config, { seed: 3 });
  model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  return model;
}

async function exportModel(model: CausalLM, path: string, type?: 'f32' | 'f16' | 'q8_0' | 'q4_0'): Promise<void> {
  const state = model.hfStateDict();
  await hfToGGUF(path, {
    config: configToHF(model.config),
    tokenizer: model.tokenizer!.toJSON() as Record<string, unknown>,
    weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape] })),
    read: (name) => state.get(name)!,
    type,
  });
}

/** A model built from a GGUF file (every weight read as float32). */
function importModel(path: string): CausalLM {
  const m = GGUFModel.open(path);
  try {
    const model = createModel(configFromHF(m.config), { init: false });
    const state = model.hfStateDict();
    assert.deepEqual(m.weights().map((w) => w.name).sort(), [...state.keys()].sort());
    for (const w of m.weights()) state.get(w.name)!.data.set(m.read(w.name).data);
    return model;
  } finally {
    m.close();
  }
}

const ids = tensor([72, 101, 108, 108, 111, 32, 256, 10], [1, 8], 'int32');

describe('GGUF models', () => {
  test('tensor names map both ways', () => {
    const pairs = [
      ['token_embd.weight', 'model.embed_tokens.weight'], ['output_norm.weight', 'model.norm.weight'], ['output.weight', 'lm_head.weight'],
      ['blk.0.attn_norm.weight', 'model.layers.0.input_layernorm.weight'],
      ['blk.11.ffn_norm.weight', 'model.layers.11.post_attention_layernorm.weight'],
      ['blk.2.attn_q.bias', 'model.layers.2.self_attn.q_proj.bias'], ['blk.2.attn_output.weight', 'model.layers.2.self_attn.o_proj.weight'],
      ['blk.3.attn_k_norm.weight', 'model.layers.3.self_attn.k_norm.weight'], ['blk.3.ffn_down.weight', 'model.layers.3.mlp.down_proj.weight'],
    ];
    for (const [g, h] of pairs) {
      assert.equal(hfTensorName(g), h);
      assert.equal(ggufTensorName(h), g);
    }
    assert.equal(hfTensorName('blk.0.ffn_gate_inp.weight'), null);
    assert.equal(ggufTensorName('model.layers.0.self_attn.rotary_emb.inv_freq'), null);
  });

  test('the q/k permutation is convert_hf_to_gguf.py\'s, its inverse undoes it, and on Q4_0 it moves whole rows exactly', () => {
    const [rows, cols, heads] = [48, 64, 3];
    const w = randn([rows, cols], { seed: 5 }).data as Float32Array;
    const forward = permuteRows(w, ropePermutation(rows, heads));
    assert.deepEqual(forward, numpyPermute(w, rows, cols, heads));
    assert.deepEqual(permuteRows(forward, ropePermutation(rows, heads, true)), w);
    const bias = randn([rows], { seed: 6 }).data as Float32Array;
    assert.deepEqual(permuteRows(bias, ropePermutation(rows, heads)), numpyPermute(bias, rows, 1, heads));
    for (const format of ['int4', 'int8', 'bf16'] as const) {
      const moved = permuteRows(packMatrix(w, rows, cols, format), ropePermutation(rows, heads));
      const expected = packMatrix(forward, rows, cols, format);
      assert.deepEqual([moved.data, moved.scales], [expected.data, expected.scales], format);
    }
    assert.throws(() => ropePermutation(10, 4), { name: 'InvalidArgumentError' });
  });

  for (const modelType of ['llama', 'qwen3', 'qwen2', 'mistral'] as const) {
    test(`${modelType}: written at F32 and read back, the same config and logits bit for bit; q/k permuted on disk only for llama`, async () => {
      // Mistral with a window shorter than the ids, so that the logits show whether it came back
      const extra = modelType === 'qwen2' ? { qkvBias: true } : modelType === 'mistral' ? { slidingWindow: 4 } : { tieWordEmbeddings: modelType !== 'qwen3' };
      const model = small({ modelType, ...extra });
      const path = join(tmp(), `${modelType}.gguf`);
      await exportModel(model, path);
      const r = GGUFReader.open(path);
      const arch = modelType === 'mistral' ? 'llama' : modelType;
      assert.equal(r.get('general.architecture'), arch);
      const state = model.hfStateDict();
      const q = state.get('model.layers.1.self_attn.q_proj.weight')!.data as Float32Array;
      const k = state.get('model.layers.1.self_attn.k_proj.weight')!.data as Float32Array;
      const permuted = arch === 'llama';
      assert.deepEqual(r.readFloat32('blk.1.attn_q.weight'), permuted ? numpyPermute(q, 64, 64, 4) : q);
      assert.deepEqual(r.readFloat32('blk.1.attn_k.weight'), permuted ? numpyPermute(k, 32, 64, 2) : k);
      if (modelType === 'qwen2') {
        const b = state.get('model.layers.1.self_attn.k_proj.bias')!.data as Float32Array;
        assert.deepEqual(r.readFloat32('blk.1.attn_k.bias'), b);
      }
      assert.equal(r.has('output.weight'), !model.config.tieWordEmbeddings);
      r.close();
      const back = importModel(path);
      // Mistral's window travels as llama.attention.sliding_window and brings the family back
      if (modelType === 'mistral') assert.equal(GGUFReader.open(path).get('llama.attention.sliding_window'), 4);
      assert.deepEqual(back.config, model.config);
      const [a, b] = noGrad(() => [model.forward(ids).data, back.forward(ids).data]);
      assert.deepEqual(b, a);
    });
  }

  test('Q4_0 and Q8_0 exports hold our int4 / int8 packing of each weight exactly (permuted rows included)', async () => {
    const model = small({});
    const state = model.hfStateDict();
    for (const [type, format] of [['q4_0', 'int4'], ['q8_0', 'int8']] as const) {
      const path = join(tmp(), `${type}.gguf`);
      await exportModel(model, path, type);
      const m = GGUFModel.open(path);
      for (const w of m.weights()) {
        const t = state.get(w.name)!;
        if (t.ndim === 1) {
          assert.equal(w.type, 'F32', w.name);
          continue;
        }
        const p = m.readPacked(w.name)!;
        const mine = packMatrix(t.data, t.shape[0], t.shape[1], format);
        assert.deepEqual([p.format, p.data, p.scales], [format, mine.data, mine.scales], w.name);
      }
      m.close();
    }
    // a packed weight given to the writer is written as it is
    const path = join(tmp(), 'packed.gguf');
    const name = 'model.layers.0.self_attn.q_proj.weight';
    const t = state.get(name)!;
    const packed = packMatrix(t.data, 64, 64, 'int4');
    await hfToGGUF(path, {
      config: configToHF(model.config), tokenizer: null,
      weights: [...state].map(([n, w]) => ({ name: n, shape: [...w.shape], ...(n === name ? { format: 'int4' as const } : {}) })),
      read: (n) => (n === name ? packed : state.get(n)!),
    });
    const m = GGUFModel.open(path);
    assert.deepEqual(m.weights().find((w) => w.name === name)!.type, 'Q4_0');
    assert.deepEqual(m.readPacked(name)!.data, packed.data);
    assert.equal(m.weights().find((w) => w.name === 'model.norm.weight')!.type, 'F32');
    assert.equal(m.tokenizer(), null);
    m.close();
  });

  test('Llama 3 rope scaling travels as rope_freqs.weight and comes back as the same rope_scaling', async () => {
    for (const scaling of [
      { type: 'llama3' as const, factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: 8192 },
      { type: 'llama3' as const, factor: 16, lowFreqFactor: 1, highFreqFactor: 8, originalMaxPositions: 256 },
    ]) {
      const model = small({ ropeScaling: scaling, hidden: 256, heads: 2, kvHeads: 1, ropeTheta: 500000, maxPositions: 1024 });
      const path = join(tmp(), 'llama3.gguf');
      await exportModel(model, path);
      const r = GGUFReader.open(path);
      const params = { factor: scaling.factor, low: 1, high: scaling.highFreqFactor, original: scaling.originalMaxPositions };
      const factors = llama3RopeFactors(500000, 128, params);
      assert.deepEqual(r.readFloat32('rope_freqs.weight'), factors);
      r.close();
      const back = importModel(path);
      const got = (back.config as LlamaConfig).ropeScaling!;
      assert.equal(got.factor, scaling.factor);
      const { lowFreqFactor, highFreqFactor, originalMaxPositions } = got;
      assert.deepEqual([lowFreqFactor, highFreqFactor, originalMaxPositions], [1, scaling.highFreqFactor, scaling.originalMaxPositions]);
      const [a, b] = noGrad(() => [model.forward(ids).data, back.forward(ids).data]);
      assert.deepEqual(b, a);
    }
  });

  test('the byte-level tokenizer becomes llama.cpp\'s gpt2 vocabulary (byte tokens, <|endoftext|> control, no BOS added) and comes back', async () => {
    const model = small({});
    const path = join(tmp(), 'tok.gguf');
    await exportModel(model, path);
    const r = GGUFReader.open(path);
    const tokens = r.get('tokenizer.ggml.tokens') as string[];
    const types = r.get('tokenizer.ggml.token_type') as number[];
    assert.equal(tokens.length, 260);
    assert.deepEqual(tokens.slice(0, 256), bytesToUnicode());
    assert.deepEqual([tokens[256], types[256], tokens[259], types[259], types[65]], ['<|endoftext|>', 3, '[PAD259]', 5, 1]);
    assert.deepEqual([r.get('tokenizer.ggml.model'), r.get('tokenizer.ggml.pre'), r.get('tokenizer.ggml.merges')], ['gpt2', 'gpt-2', []]);
    assert.deepEqual([r.get('tokenizer.ggml.bos_token_id'), r.get('tokenizer.ggml.eos_token_id'), r.get('tokenizer.ggml.add_bos_token')], [256, 256, false]);
    const tok = tokenizerFromGGUF(r)!;
    r.close();
    assert.equal(tok.addBos, false);
    const back = new HFTokenizer(tok.json);
    const text = 'Héllo, wörld! 🦙\n\tcode();<|endoftext|> end';
    assert.deepEqual(back.encode(text), model.tokenizer!.encode(text));
    assert.equal(back.decode(back.encode(text)), text);
    assert.equal(back.eosTokenId, 256);
    const { config, tokenizer, tensors } = ggufToHF(path);
    assert.equal(config.model_type, 'llama');
    assert.ok(tokenizer);
    assert.equal([...tensors].length, model.hfStateDict().size);
  });

  test('a SentencePiece vocabulary (tokenizer.ggml.model llama) tokenizes as llama.cpp does (its ids, from node-llama-cpp 3.21.1)', () => {
    // a small vocabulary: <unk>, <s>, </s>, 256 byte tokens, then pieces of a corpus (every piece of 1 char, and the
    // pieces of 2 to 5 that occur twice or more), scored by frequency
    const corpus = 'the quick brown fox jumps over the lazy dog. Hello world, hello there! then they thought the other three were there';
    const counts = new Map<string, number>();
    for (const w of corpus.split(' ')) {
      const cs = [...`▁${w}`];
      for (let i = 0; i < cs.length; i++) {
        for (let n = 1; n <= 5 && i + n <= cs.length; n++) {
          const piece = cs.slice(i, i + n).join('');
          counts.set(piece, (counts.get(piece) ?? 0) + 1);
        }
      }
    }
    const kept = [...counts].filter(([s, c]) => [...s].length === 1 || c >= 2);
    const pieces = kept.sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)).map(([s]) => s);
    const bytes = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    const tokens = ['<unk>', '<s>', '</s>', ...bytes, ...pieces];
    const path = join(tmp(), 'spm.gguf');
    writeGGUF(path, {
      'tokenizer.ggml.model': GGUFMeta.str('llama'),
      'tokenizer.ggml.tokens': GGUFMeta.array('string', tokens),
      'tokenizer.ggml.scores': GGUFMeta.array('float32', [0, 0, 0, ...bytes.map(() => 0), ...pieces.map((p, i) => -i - [...p].length * 0.01)]),
      'tokenizer.ggml.token_type': GGUFMeta.array('int32', [2, 3, 3, ...bytes.map(() => 6), ...pieces.map(() => 1)]),
      'tokenizer.ggml.bos_token_id': GGUFMeta.u32(1),
    }, []);
    const r = GGUFReader.open(path);
    const tok = tokenizerFromGGUF(r)!;
    r.close();
    assert.equal(tok.addBos, true);
    const ours = new HFTokenizer(tok.json);
    const llamaCpp: [string, number[]][] = [
      ['Hello world', [259, 297, 282, 293, 265, 268, 271, 279]],
      ['the other three thought', [270, 291, 276, 267, 273, 260, 267, 265, 277, 283, 261, 262]],
      ['new\nline €', [259, 288, 260, 278, 13, 271, 302, 288, 260, 259, 229, 133, 175]], // bytes of \n and € as <0xXX>
      ['hello</s>there', [259, 264, 286, 2, 270, 273]],
    ];
    for (const [text, expected] of llamaCpp) assert.deepEqual(ours.encode(text), expected, text);
    assert.equal(ours.decode(ours.encode('new\nline €')), 'new\nline €');
    // the file's add_bos_token (absent: llama.cpp's default for SentencePiece, true): a prompt begins with <s>, once
    const withBos = new HFTokenizer(tok.json, tok.config);
    assert.deepEqual(tok.config, { add_bos_token: true, bos_token: '<s>' });
    assert.deepEqual(promptIds(withBos, 'Hello world'), [1, ...llamaCpp[0][1]]);
    assert.deepEqual(promptIds(withBos, '<s>Hello world'), [1, ...llamaCpp[0][1]]);
    assert.deepEqual(withBos.encode('Hello world'), llamaCpp[0][1], 'encode adds nothing');
    // and a directory written from it says so in tokenizer_config.json
    const dir = join(tmp(), 'spm-dir');
    writeModelFiles(dir, small({}).config, withBos);
    assert.equal(loadTokenizer(dir)!.bosTokenId, 1);
  });

  test('what cannot be converted is a clear error', async () => {
    const model = small({});
    const state = model.hfStateDict();
    const weights0 = [...state].map(([name, t]) => ({ name, shape: [...t.shape] }));
    const base = { tokenizer: null, weights: weights0, read: (n: string) => state.get(n)! };
    const dir = tmp();
    await assert.rejects(hfToGGUF(join(dir, 'a.gguf'), { ...base, config: { ...configToHF(model.config), model_type: 'phi3' } }), { name: 'InvalidArgumentError' });
    const weights = [{ name: 'model.rotary.inv_freq', shape: [4] }];
    await assert.rejects(hfToGGUF(join(dir, 'b.gguf'), { ...base, config: configToHF(model.config), weights }), { name: 'InvalidArgumentError', message: /no GGUF name/ });
    const wordLevel = { model: { type: 'WordLevel', vocab: {} } };
    await assert.rejects(hfToGGUF(join(dir, 'c.gguf'), { ...base, config: configToHF(model.config), tokenizer: wordLevel }), { name: 'InvalidArgumentError' });
  });
});
