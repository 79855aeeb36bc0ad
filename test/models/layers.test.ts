import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, gpt2Config, HFTokenizer, llamaConfig } from '../../src/models/index.ts';
import { noGrad, setBackend, tensor } from '../../src/tensor/index.ts';

describe('models as sequences of layers', () => {
  setBackend('js');
  test('layers cover every parameter once and run in order to the same logits', () => {
    for (const config of [
      gpt2Config({ vocabSize: 50, hidden: 32, layers: 3, heads: 4, maxPositions: 16, tieWordEmbeddings: false }),
      llamaConfig({ vocabSize: 50, hidden: 32, layers: 3, heads: 4, kvHeads: 1, intermediate: 40, maxPositions: 16 }),
    ]) {
      const model = createModel(config, { seed: 2 });
      assert.deepEqual(
        model.layers.map((l) => l.kind),
        ['embedding', 'block', 'block', 'block', 'norm', 'head'],
      );
      const names = model.layers.flatMap((l) => l.namedParameters().map(([n]) => n));
      assert.deepEqual([...names].sort(), [...model.hfStateDict().keys()].sort());
      const params = model.layers.reduce((n, l) => n + l.profile().params, 0);
      assert.equal(params, model.numParameters());
      for (const l of model.layers) {
        const p = l.profile();
        assert.equal(p.bytes, 4 * p.params);
        assert.ok(p.activationBytesPerToken > 0);
        if (l.kind === 'block') assert.ok(p.flopsPerToken >= 2 * p.params && p.kvBytesPerToken > 0);
      }
    }
  });

  test('a Llama-style tokenizer.json (metaspace, byte fallback) encodes and decodes', () => {
    const vocab: Record<string, number> = { '<unk>': 0, '<s>': 1, '</s>': 2 };
    for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = 3 + b;
    for (const piece of ['▁', 'h', 'e', 'l', 'o', 'w', 'r', 'd', '▁h', 'll', '▁he', '▁hell', '▁hello', '▁w', 'or', '▁wor', '▁world', 'ld']) {
      vocab[piece] = Object.keys(vocab).length;
    }
    const json = {
      version: '1.0',
      added_tokens: ['<unk>', '<s>', '</s>'].map((content, id) => ({
        id,
        content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: true,
      })),
      normalizer: {
        type: 'Sequence',
        normalizers: [
          { type: 'Prepend', prepend: '▁' },
          { type: 'Replace', pattern: { String: ' ' }, content: '▁' },
        ],
      },
      pre_tokenizer: null,
      post_processor: null,
      decoder: {
        type: 'Sequence',
        decoders: [
          { type: 'Replace', pattern: { String: '▁' }, content: ' ' },
          { type: 'ByteFallback' },
          { type: 'Fuse' },
          { type: 'Strip', content: ' ', start: 1, stop: 0 },
        ],
      },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: '<unk>',
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: true,
        byte_fallback: true,
        vocab,
        merges: ['▁ h', 'l l', '▁h e', '▁he ll', '▁hell o', '▁ w', 'o r', '▁w or', 'l d', '▁wor ld'],
      },
    };
    const tok = new HFTokenizer(json, { eos_token: '</s>' });
    const ids = tok.encode('hello world');
    assert.deepEqual(ids, [vocab['▁hello'], vocab['▁world']]);
    assert.equal(tok.decode(ids), 'hello world');
    const accented = tok.encode('hé');
    assert.ok(accented.includes(vocab['<0xC3>']) && accented.includes(vocab['<0xA9>']), 'byte fallback');
    assert.equal(tok.decode(accented), 'hé');
    assert.equal(tok.eosTokenId, 2);
  });

  test('a batch of one sequence gives the same logits as the whole model forward', () => {
    const model = createModel(gpt2Config({ vocabSize: 30, hidden: 16, layers: 2, heads: 2, maxPositions: 8 }), { seed: 1 });
    const ids = tensor([1, 2, 3], [1, 3], 'int32');
    const direct = noGrad(() => model.forward(ids));
    const ctx = { positions: tensor([0, 1, 2], [1, 3], 'int32'), keyMask: null, cache: null };
    let x = ids;
    for (const layer of model.layers) x = noGrad(() => layer.forward(x, ctx));
    assert.deepEqual(x.data, direct.data);
  });
});
