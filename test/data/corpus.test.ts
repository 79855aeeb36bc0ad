import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { before, describe, test } from 'node:test';
import {
  CORPORA, corpusByName, fortuneQuotes, fortunesDataset, heldOutLoss, isCorpusName, loadFortunes, QUOTE_SEPARATOR, splitQuotes,
  type TextDataset,
} from '../../src/data/index.ts';
import { Tokenizer as LibraryTokenizer } from '@huggingface/tokenizers';
import { byteLevelTokenizerJson, HFTokenizer } from '../../src/models/index.ts';
import { byteLevelTable } from '../../src/models/tokenizer.ts';
import { type Tensor, tensor, zeros } from '../../src/tensor/index.ts';

const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
const sha = (s: string) => createHash('sha256').update(s).digest('hex');

describe('fortunes corpus (Debian fortunes package)', () => {
  let quotes: string[];
  let dataset: TextDataset;
  before(() => {
    quotes = fortuneQuotes();
    dataset = fortunesDataset(tok);
  });

  test('loads more than 1 MB of text and 5000 quotes, the same on every load', () => {
    const text = loadFortunes();
    assert.ok(Buffer.byteLength(text) > 1_000_000, `${Buffer.byteLength(text)} bytes`);
    assert.ok(quotes.length > 5000, `${quotes.length} quotes`);
    assert.ok(quotes.every((q) => q.length > 0 && q === q.trim() && !/^%$/m.test(q)));
    assert.equal(text, quotes.join(QUOTE_SEPARATOR));
    assert.equal(sha(loadFortunes()), sha(text));
  });

  test('held-out and training quotes share none; the split is about 5% and seeded by nothing but the text', () => {
    const { train, heldOut } = splitQuotes(quotes);
    assert.equal(train.length + heldOut.length, quotes.length);
    const trainSet = new Set(train);
    assert.ok(heldOut.every((q) => !trainSet.has(q)));
    const share = heldOut.length / quotes.length;
    assert.ok(share > 0.04 && share < 0.06, `held-out share ${share}`);
    assert.deepEqual(splitQuotes([...quotes].reverse()).heldOut, [...heldOut].reverse(), 'a quote\'s side depends on its text only');
  });

  test('byte-level tokens: all < 257, and the two sides are exactly the split quotes', () => {
    const { train, heldOut } = splitQuotes(quotes);
    for (const part of [dataset.train, dataset.heldOut]) {
      let max = 0;
      for (const id of part) max = Math.max(max, id);
      assert.ok(max < 257 && Math.min(...part.subarray(0, 1000)) >= 0);
    }
    assert.equal(Buffer.from(Uint8Array.from(dataset.heldOut)).toString('utf8'), heldOut.join(QUOTE_SEPARATOR));
    assert.equal(Buffer.from(Uint8Array.from(dataset.train)).toString('utf8'), train.join(QUOTE_SEPARATOR));
    assert.ok(dataset.heldOut.length > 65536, `${dataset.heldOut.length} held-out tokens`);
  });

  test('a uniform model scores ln(vocab) nats, perplexity vocab, over at least 64k held-out tokens', async () => {
    const vocab = tok.vocabSize;
    assert.equal(vocab, 257);
    const r = await heldOutLoss((input: Tensor) => zeros([...input.shape, vocab]), dataset.heldOut, { seqLen: 64, batchSize: 8 });
    assert.ok(Math.abs(r.loss - Math.log(vocab)) < 1e-6, `loss ${r.loss}`);
    assert.ok(Math.abs(r.perplexity - vocab) < 1e-3, `perplexity ${r.perplexity}`);
    assert.ok(r.tokens >= 65536 && r.tokens % 64 === 0, `${r.tokens} tokens`);
  });

  test('a byte-level tokenizer without merges encodes by its table: the ids of @huggingface/tokenizers, corpus and edge cases', () => {
    const json = byteLevelTokenizerJson() as Record<string, unknown>;
    const library = new LibraryTokenizer(json, {});
    const theirs = (text: string) => library.encode(text, { add_special_tokens: false }).ids;
    const texts = [loadFortunes(), '', 'héllo wörld ✓ 😀 \u00a0\u2028', ' lone \ud800 surrogate \udfff', '  spaces\n\ttabs\r\n', 'a <|endoftext|> b'];
    for (const text of texts) assert.deepEqual(tok.encode(text), theirs(text), JSON.stringify(text.slice(0, 40)));
    assert.equal(tok.encode('x<|endoftext|>').at(-1), 256, 'an added token in the text goes through the library');
    // anything but byte-level BPE without merges keeps the library's path
    const merged = { ...json, model: { ...(json.model as object), merges: [['a', 'b']] } };
    assert.equal(byteLevelTable(merged), null);
    assert.equal(byteLevelTable({ ...json, normalizer: { type: 'NFC' } }), null);
    assert.equal(byteLevelTable({ ...json, model: { ...(json.model as object), end_of_word_suffix: '</w>' } }), null);
    assert.equal(byteLevelTable({ ...json, pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true } }), null);
    const vocab = { ...(json.model as { vocab: Record<string, number> }).vocab };
    delete vocab.a;
    assert.equal(byteLevelTable({ ...json, model: { ...(json.model as object), vocab } }), null);
    assert.equal(byteLevelTable(json)?.[97], 97);
  });

  test('named corpora', () => {
    assert.deepEqual([...CORPORA], ['fortunes']);
    assert.ok(isCorpusName('fortunes'));
    assert.ok(!isCorpusName('corpus.txt'));
    assert.equal(typeof corpusByName('fortunes'), 'function');
    assert.throws(() => corpusByName('nope'), (err: Error) => err.name === 'InvalidArgumentError');
  });
});

describe('fortune files', () => {
  test('a hand-made directory: sorted files, % lines only, trimmed, no .dat, .u8, subdirectories or empty quotes', () => {
    const dir = mkdtempSync(join(tmpdir(), 'fortunes-'));
    writeFileSync(join(dir, 'b'), 'Second file.\n%\n');
    writeFileSync(join(dir, 'a'), '%\n  First quote,\n  two lines.  \n%\n\n%\n50% off: a % inside a line.\n%\r\nLast, no final %.\n');
    writeFileSync(join(dir, 'a.dat'), Buffer.from([0, 0, 0, 2, 0xff, 0xfe, 0x25]));
    symlinkSync('a', join(dir, 'a.u8'));
    mkdirSync(join(dir, 'off'));
    writeFileSync(join(dir, 'off', 'c'), 'Offensive.\n%\n');
    assert.deepEqual(fortuneQuotes(dir), ['First quote,\n  two lines.', '50% off: a % inside a line.', 'Last, no final %.', 'Second file.']);
    assert.equal(loadFortunes(dir), 'First quote,\n  two lines.\n\n50% off: a % inside a line.\n\nLast, no final %.\n\nSecond file.');
  });

  test('a missing directory says to install the package', () => {
    const dir = join(tmpdir(), 'no-fortunes-here');
    assert.throws(() => loadFortunes(dir), (err: Error) => err.name === 'FileNotFoundError' && /apt-get install fortunes/.test(err.message));
    assert.throws(() => fortunesDataset(tok, { dir }), (err: Error) => err.name === 'FileNotFoundError');
  });
});

describe('heldOutLoss', () => {
  const data = Int32Array.from({ length: 1000 }, (_, i) => i % 257);

  test('fixed windows from the start, targets shifted by one, capped at the windows the data holds', async () => {
    const seen: number[][] = [];
    // predicts (token + 1) mod 257 with near certainty: right on this data, so the loss is ~0
    const successor = (input: Tensor) => {
      seen.push([...input.data]);
      const [b, t] = input.shape;
      const logits = new Float32Array(b * t * 257);
      input.data.forEach((id, i) => (logits[i * 257 + ((id + 1) % 257)] = 50));
      return tensor(logits, [b, t, 257]);
    };
    const r = await heldOutLoss(successor, data, { seqLen: 64, batchSize: 4, windows: 100 });
    assert.equal(r.tokens, 15 * 64, 'floor(999 / 64) windows');
    assert.ok(r.loss < 1e-6 && r.loss >= 0, `loss ${r.loss}`);
    assert.deepEqual(seen.map((s) => s.length), [256, 256, 256, 192]);
    assert.deepEqual(seen.flat(), [...data.subarray(0, 960)]);
    const again = await heldOutLoss(async (x) => zeros([...x.shape, 257]), data, { seqLen: 64, batchSize: 3, windows: 2 });
    assert.equal(again.tokens, 128);
  });

  test('rejects bad sizes and too little data', async () => {
    const uniform = (x: Tensor) => zeros([...x.shape, 257]);
    await assert.rejects(heldOutLoss(uniform, data, { seqLen: 0, batchSize: 1 }), (err: Error) => err.name === 'InvalidArgumentError');
    await assert.rejects(heldOutLoss(uniform, data.subarray(0, 10), { seqLen: 10, batchSize: 1 }), (err: Error) => err.name === 'InvalidArgumentError');
  });
});
