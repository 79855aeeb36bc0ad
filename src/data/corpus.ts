import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { FileNotFoundError, InvalidArgumentError } from '../errors.ts';
import { crossEntropy, noGrad, type Tensor, tensor } from '../tensor/index.ts';
import type { TextCodec } from './batches.ts';
import type { TextDataset } from './text.ts';

/** Where Debian's `fortunes` package puts its quotes (about 2.6 MB of English text). */
export const FORTUNES_DIR = '/usr/share/games/fortunes';

/** The named corpora the CLI accepts for `--data` (anything else is a path to a text file). */
export const CORPORA = ['fortunes'] as const;
export type CorpusName = (typeof CORPORA)[number];

/** What separates one quote from the next in a corpus's text: a blank line. */
export const QUOTE_SEPARATOR = '\n\n';

/** The share of fortunes held out by default (about 5%: 767 of 15,217 quotes, 133k of 2.56M byte tokens). */
export const DEFAULT_HELD_OUT_SHARE = 0.05;

/** `heldOutLoss` scores at least this many held-out tokens by default (or all there are). */
export const HELD_OUT_EVAL_TOKENS = 65536;

/**
 * Every quote of a fortune directory, in a fixed order: the regular fortune text files
 * (not the `.dat` indexes, not the `.u8` symlinks, not subdirectories such as `off/`) in
 * sorted file-name order (code-unit order, not the locale's), each split on lines that
 * hold only `%`, each quote trimmed, empty ones dropped.
 */
export function fortuneQuotes(dir = FORTUNES_DIR): string[] {
  let names: string[];
  try {
    names = readdirSync(dir, { withFileTypes: true })
      .filter((e) => e.isFile() && !e.name.startsWith('.') && !e.name.endsWith('.dat') && !e.name.endsWith('.u8'))
      .map((e) => e.name)
      .sort();
  } catch (cause) {
    throw new FileNotFoundError(`Debian's fortunes package is not installed (no ${dir}): apt-get install fortunes`, {
      cause,
      details: { dir },
    });
  }
  const quotes: string[] = [];
  for (const name of names) {
    // Every file of fortunes 1:1.99.1-7.3 (Debian 12) is valid UTF-8 (the `.u8` names are
    // symlinks to the same files). readFileSync's decoder is non-fatal: a stray invalid byte
    // would become U+FFFD rather than fail the load.
    const text = readFileSync(join(dir, name), 'utf8');
    for (const part of text.split(/^%\r?$/m)) {
      const quote = part.trim();
      if (quote.length > 0) quotes.push(quote);
    }
  }
  if (quotes.length === 0) throw new FileNotFoundError(`no fortune files with quotes in ${dir}`, { details: { dir } });
  return quotes;
}

/** The quotes of a fortune directory as one text, quotes separated by a blank line. */
export function loadFortunes(dir = FORTUNES_DIR): string {
  return fortuneQuotes(dir).join(QUOTE_SEPARATOR);
}

/**
 * Whether a quote belongs to the held-out split: a hash of its text (FNV-1a over its UTF-8
 * bytes, then murmur3's finaliser) read as a fraction of 2^32, below `heldOutShare`.
 * Chosen over a tail or every k-th quote because (1) a quote that appears more than once in the
 * collection (86 repeats, across files) lands on the same side every time, so no held-out quote
 * is ever seen in training; (2) the held-out quotes come from every file (topic), not the
 * alphabetically last ones; (3) a quote's side depends only on its own text, so it stays put
 * when a package update adds or removes other quotes. Integer math only: the same on every machine.
 */
export function isHeldOutQuote(quote: string, heldOutShare: number): boolean {
  let h = 0x811c9dc5;
  for (const byte of Buffer.from(quote, 'utf8')) h = Math.imul(h ^ byte, 0x01000193);
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return (h >>> 0) / 2 ** 32 < heldOutShare;
}

/** Quotes split into training and held-out quotes (see `isHeldOutQuote`), each in its original order. */
export function splitQuotes(quotes: readonly string[], heldOutShare = DEFAULT_HELD_OUT_SHARE): { train: string[]; heldOut: string[] } {
  if (!(heldOutShare > 0 && heldOutShare < 1)) throw new InvalidArgumentError(`heldOutShare must be in (0, 1), got ${heldOutShare}`);
  const train: string[] = [];
  const heldOut: string[] = [];
  for (const q of quotes) (isHeldOutQuote(q, heldOutShare) ? heldOut : train).push(q);
  if (train.length === 0 || heldOut.length === 0) {
    throw new InvalidArgumentError(`a held-out share of ${heldOutShare} leaves ${train.length} training and ${heldOut.length} held-out quotes`);
  }
  return { train, heldOut };
}

/**
 * Debian's fortunes as tokens: training quotes and held-out quotes (split by quote, never
 * inside one: see `isHeldOutQuote`), each side joined with blank lines and encoded with
 * `codec` (the init-model tokenizer is byte-level: token = UTF-8 byte).
 */
export function fortunesDataset(codec: TextCodec, options: { heldOutShare?: number; dir?: string } = {}): TextDataset {
  const { train, heldOut } = splitQuotes(fortuneQuotes(options.dir), options.heldOutShare);
  return {
    train: Int32Array.from(codec.encode(train.join(QUOTE_SEPARATOR))),
    heldOut: Int32Array.from(codec.encode(heldOut.join(QUOTE_SEPARATOR))),
  };
}

export function isCorpusName(name: string): name is CorpusName {
  return (CORPORA as readonly string[]).includes(name);
}

const LOADERS: Record<CorpusName, (codec: TextCodec) => TextDataset> = {
  fortunes: (codec) => fortunesDataset(codec),
};

/** A named corpus's loader (`--data fortunes`); the caller treats other names as paths. */
export function corpusByName(name: string): (codec: TextCodec) => TextDataset {
  if (!isCorpusName(name)) throw new InvalidArgumentError(`unknown corpus ${JSON.stringify(name)}; known: ${CORPORA.join(', ')}`);
  return LOADERS[name];
}

export interface HeldOutLoss {
  /** Mean next-token cross-entropy, in nats. */
  loss: number;
  /** exp(loss). */
  perplexity: number;
  /** How many tokens were scored. */
  tokens: number;
}

/**
 * Mean next-token cross-entropy over fixed windows from the start of `data`: window w has
 * input data[w·T, w·T + T) and target data[w·T + 1, w·T + T + 1), so every scored token is
 * scored once and two runs (or two models) score the very same tokens. `windows` defaults to
 * enough windows to cover `HELD_OUT_EVAL_TOKENS` tokens, and is capped at the windows `data`
 * holds; `tokens` in the result says how many were scored. `logitsOf` gets [B, T] int32 ids
 * and returns [B, T, V] logits; a synchronous one runs under `noGrad`, an async one should
 * turn gradients off itself.
 */
export async function heldOutLoss(
  logitsOf: (input: Tensor) => Promise<Tensor> | Tensor,
  data: Int32Array,
  options: { seqLen: number; batchSize: number; windows?: number },
): Promise<HeldOutLoss> {
  const { seqLen, batchSize } = options;
  if (!Number.isInteger(seqLen) || seqLen < 1) throw new InvalidArgumentError(`seqLen must be a positive integer, got ${seqLen}`);
  if (!Number.isInteger(batchSize) || batchSize < 1) throw new InvalidArgumentError(`batchSize must be a positive integer, got ${batchSize}`);
  const available = Math.floor((data.length - 1) / seqLen);
  if (available < 1) throw new InvalidArgumentError(`the held-out text has ${data.length} tokens, fewer than one window of ${seqLen + 1}`);
  const wanted = options.windows ?? Math.ceil(HELD_OUT_EVAL_TOKENS / seqLen);
  if (!Number.isInteger(wanted) || wanted < 1) throw new InvalidArgumentError(`windows must be a positive integer, got ${wanted}`);
  const windows = Math.min(wanted, available);
  let total = 0;
  for (let first = 0; first < windows; first += batchSize) {
    const rows = Math.min(batchSize, windows - first);
    const input = new Int32Array(rows * seqLen);
    const target = new Int32Array(rows * seqLen);
    for (let r = 0; r < rows; r++) {
      const start = (first + r) * seqLen;
      input.set(data.subarray(start, start + seqLen), r * seqLen);
      target.set(data.subarray(start + 1, start + seqLen + 1), r * seqLen);
    }
    const logits = await noGrad(() => logitsOf(tensor(input, [rows, seqLen], 'int32')));
    total += noGrad(() => crossEntropy(logits, tensor(target, [rows, seqLen], 'int32'), { reduction: 'sum' }).item());
  }
  const tokens = windows * seqLen;
  const loss = total / tokens;
  return { loss, perplexity: Math.exp(loss), tokens };
}
