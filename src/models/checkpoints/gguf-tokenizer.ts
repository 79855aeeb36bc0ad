import { InvalidArgumentError } from '../../errors.ts';
import { GGUFMeta, type GGUFReader, type GGUFValue } from '../../io/index.ts';

/**
 * Tokenizers between Hugging Face's tokenizer.json and GGUF's `tokenizer.ggml.*` metadata, for byte-level BPE (which
 * llama.cpp's `tokenizer.ggml.model` names `gpt2`): the one `tensorlink init-model` writes (256 byte tokens, no merges,
 * then `<|endoftext|>`), and those with the pre-tokenizers below. SentencePiece vocabularies (`tokenizer.ggml.model` =
 * `llama`) are read, not written.
 *
 * The rule for a leading BOS: our `Tokenizer.encode` adds no special token (HFTokenizer encodes with
 * add_special_tokens false, and `generate` prepends nothing), so a GGUF we write says `tokenizer.ggml.add_bos_token`
 * false, and llama.cpp, asked to add special tokens, adds none either: the same ids for the same text. Reading a GGUF
 * whose add_bos_token is true, `addBos` says so; the caller decides whether to prepend bos_token_id.
 */

/** llama.cpp's token types (llama_token_type). */
export const TOKEN_TYPE = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

/**
 * The pre-tokenizers of llama.cpp (`tokenizer.ggml.pre`) that we map to tokenizer.json, each with its split regex
 * (null: the split inside the ByteLevel pre-tokenizer itself).
 */
const PRE_TOKENIZERS: Record<string, string | null> = {
  'gpt-2': null,
  'default': null,
  'llama-bpe': String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
  'qwen2': String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
};

type Json = Record<string, unknown>;

/** The GGUF pre-tokenizer name of a tokenizer.json's pre_tokenizer, or null when it is none we know. */
function preTokenizerName(pre: unknown): string | null {
  const p = pre as Json | null;
  if (p?.type === 'ByteLevel') return p.use_regex === false ? null : 'gpt-2';
  if (p?.type !== 'Sequence' || !Array.isArray(p.pretokenizers) || p.pretokenizers.length !== 2) return null;
  const [split, byteLevel] = p.pretokenizers as Json[];
  const regex = (split?.pattern as Json | undefined)?.Regex;
  if (split?.type !== 'Split' || byteLevel?.type !== 'ByteLevel' || byteLevel.use_regex !== false) return null;
  return Object.keys(PRE_TOKENIZERS).find((k) => PRE_TOKENIZERS[k] !== null && PRE_TOKENIZERS[k] === regex) ?? null;
}

/**
 * The `tokenizer.ggml.*` metadata of a byte-level BPE tokenizer.json, padded to `vocabSize` tokens with `[PAD<i>]`
 * tokens of type unused (as llama.cpp's convert_hf_to_gguf.py pads), so that the token list is as long as the
 * embedding. Throws for a tokenizer this cannot convert.
 */
export function tokenizerToGGUF(json: Json, vocabSize: number, ids: { bos?: number; eos?: number }): Record<string, GGUFValue> {
  const model = json.model as { type?: string; vocab?: Record<string, number>; merges?: (string | [string, string])[] } | undefined;
  if (model?.type !== 'BPE' || typeof model.vocab !== 'object' || model.vocab === null) {
    throw new InvalidArgumentError(`only a BPE tokenizer.json can be written to GGUF, this one is ${model?.type ?? 'without a model'}`);
  }
  const pre = preTokenizerName(json.pre_tokenizer);
  if (pre === null) {
    throw new InvalidArgumentError(`the tokenizer's pre_tokenizer ${JSON.stringify(json.pre_tokenizer)} has no llama.cpp equivalent we know (byte-level, with the splits of ${Object.keys(PRE_TOKENIZERS).join(', ')})`);
  }
  const tokens: (string | undefined)[] = new Array(vocabSize);
  const types: number[] = new Array(vocabSize).fill(TOKEN_TYPE.normal);
  const put = (token: string, id: number, type: number) => {
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw new InvalidArgumentError(`token '${token}' has id ${id}, outside the model's ${vocabSize} embeddings`);
    tokens[id] = token;
    types[id] = type;
  };
  for (const [token, id] of Object.entries(model.vocab)) put(token, id, TOKEN_TYPE.normal);
  for (const a of (json.added_tokens as { id: number; content: string; special?: boolean }[] | undefined) ?? []) {
    put(a.content, a.id, a.special ? TOKEN_TYPE.control : TOKEN_TYPE.userDefined);
  }
  for (let i = 0; i < vocabSize; i++) {
    if (tokens[i] === undefined) {
      tokens[i] = `[PAD${i}]`;
      types[i] = TOKEN_TYPE.unused;
    }
  }
  const merges = (model.merges ?? []).map((m) => (Array.isArray(m) ? m.join(' ') : m));
  const out: Record<string, GGUFValue> = {
    'tokenizer.ggml.model': GGUFMeta.str('gpt2'),
    'tokenizer.ggml.pre': GGUFMeta.str(pre),
    'tokenizer.ggml.tokens': GGUFMeta.array('string', tokens as string[]),
    'tokenizer.ggml.token_type': GGUFMeta.array('int32', types),
    // llama.cpp refuses a gpt2 vocabulary without this key, even when there are no merges
    'tokenizer.ggml.merges': GGUFMeta.array('string', merges),
  };
  if (ids.bos !== undefined) out['tokenizer.ggml.bos_token_id'] = GGUFMeta.u32(ids.bos);
  if (ids.eos !== undefined) out['tokenizer.ggml.eos_token_id'] = GGUFMeta.u32(ids.eos);
  out['tokenizer.ggml.add_bos_token'] = GGUFMeta.bool(false);
  out['tokenizer.ggml.add_eos_token'] = GGUFMeta.bool(false);
  return out;
}

/**
 * A GGUF file's tokenizer as a tokenizer.json (null when it has none), whether llama.cpp would add a BOS, and that as a
 * tokenizer_config.json says it (`add_bos_token`, `bos_token`: a prompt then begins with it, see `promptIds`).
 */
export function tokenizerFromGGUF(reader: GGUFReader): { json: Json; addBos: boolean; config: Json } | null {
  const read = readTokenizer(reader);
  if (!read) return null;
  const tokens = reader.get('tokenizer.ggml.tokens');
  const bos = reader.get('tokenizer.ggml.bos_token_id');
  const name = Array.isArray(tokens) && bos !== undefined ? tokens[Number(bos)] : undefined;
  const config = read.addBos && typeof name === 'string' ? { add_bos_token: true, bos_token: name } : {};
  return { ...read, config };
}

function readTokenizer(reader: GGUFReader): { json: Json; addBos: boolean } | null {
  const kind = reader.get('tokenizer.ggml.model');
  if (kind === undefined || kind === 'none') return null;
  if (kind === 'llama') return { json: sentencePieceJson(reader), addBos: reader.get('tokenizer.ggml.add_bos_token') !== false };
  if (kind !== 'gpt2') {
    throw new InvalidArgumentError(`${reader.path}: its tokenizer is '${String(kind)}'; only byte-level BPE ('gpt2') and SentencePiece ('llama') tokenizers are read from GGUF`);
  }
  const { tokens, types } = tokenList(reader);
  const pre = String(reader.get('tokenizer.ggml.pre') ?? 'default');
  if (!Object.hasOwn(PRE_TOKENIZERS, pre)) {
    throw new InvalidArgumentError(`${reader.path}: pre-tokenizer '${pre}' is not supported (${Object.keys(PRE_TOKENIZERS).join(', ')})`);
  }
  const vocab: Record<string, number> = {};
  const added: Json[] = [];
  tokens.forEach((token, id) => {
    const type = types[id] ?? TOKEN_TYPE.normal;
    if (type === TOKEN_TYPE.control || type === TOKEN_TYPE.userDefined) {
      const special = type === TOKEN_TYPE.control;
      added.push({ id, content: token, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
    }
    if (!Object.hasOwn(vocab, token)) vocab[token] = id;
  });
  const merges = reader.get('tokenizer.ggml.merges');
  const regex = PRE_TOKENIZERS[pre];
  const byteLevel = { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: regex === null };
  const json: Json = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: regex === null
      ? byteLevel
      : { type: 'Sequence', pretokenizers: [{ type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false }, byteLevel] },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: '',
      end_of_word_suffix: '',
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: pre === 'llama-bpe', // as that pre-tokenizer's tokenizer.json
      vocab,
      merges: Array.isArray(merges) ? merges.map(String) : [],
    },
  };
  return { json, addBos: reader.get('tokenizer.ggml.add_bos_token') === true };
}

/** The token list and types of a GGUF tokenizer, checked. */
function tokenList(reader: GGUFReader): { tokens: string[]; types: number[] } {
  const tokens = reader.get('tokenizer.ggml.tokens');
  if (!Array.isArray(tokens) || tokens.some((t) => typeof t !== 'string')) throw new InvalidArgumentError(`${reader.path}: tokenizer.ggml.tokens is not a list of strings`);
  const rawTypes = reader.get('tokenizer.ggml.token_type');
  const types = Array.isArray(rawTypes) ? rawTypes.map(Number) : [];
  return { tokens: tokens as string[], types };
}

/**
 * A SentencePiece vocabulary (`tokenizer.ggml.model` = `llama`) as the tokenizer.json
 * transformers' LlamaConverter makes (legacy form): spaces as ▁ (and one ▁ before the text when
 * `tokenizer.ggml.add_space_prefix`, default true), BPE whose merges are every split of a piece into two pieces,
 * ranked by the merged piece's score (llama.cpp merges the pair of highest score first), bytes as `<0xXX>` tokens.
 */
function sentencePieceJson(reader: GGUFReader): Json {
  const { tokens, types } = tokenList(reader);
  const rawScores = reader.get('tokenizer.ggml.scores');
  const scores = Array.isArray(rawScores) ? rawScores.map(Number) : tokens.map((_, i) => -i);
  const vocab: Record<string, number> = {};
  const added: Json[] = [];
  tokens.forEach((token, id) => {
    if (!Object.hasOwn(vocab, token)) vocab[token] = id;
    const type = types[id] ?? TOKEN_TYPE.normal;
    if (type === TOKEN_TYPE.control || type === TOKEN_TYPE.userDefined || type === TOKEN_TYPE.unknown) {
      const special = type !== TOKEN_TYPE.userDefined;
      added.push({ id, content: token, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
    }
  });
  const candidates: { a: string; b: string; score: number; ia: number; ib: number }[] = [];
  tokens.forEach((token, id) => {
    const type = types[id] ?? TOKEN_TYPE.normal;
    if (type !== TOKEN_TYPE.normal && type !== TOKEN_TYPE.userDefined) return;
    const chars = [...token];
    for (let k = 1; k < chars.length; k++) {
      const a = chars.slice(0, k).join('');
      const b = chars.slice(k).join('');
      if (Object.hasOwn(vocab, a) && Object.hasOwn(vocab, b)) candidates.push({ a, b, score: scores[id], ia: vocab[a], ib: vocab[b] });
    }
  });
  candidates.sort((x, y) => y.score - x.score || x.ia - y.ia || x.ib - y.ib);
  const unknownId = types.indexOf(TOKEN_TYPE.unknown);
  const prefix = reader.get('tokenizer.ggml.add_space_prefix') !== false;
  const replace = { type: 'Replace', pattern: { String: ' ' }, content: '▁' };
  const decoders: Json[] = [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }];
  if (prefix) decoders.push({ type: 'Strip', content: ' ', start: 1, stop: 0 });
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: prefix ? { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, replace] } : replace,
    pre_tokenizer: null,
    post_processor: null,
    decoder: { type: 'Sequence', decoders },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: unknownId >= 0 ? tokens[unknownId] : null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      ignore_merges: false,
      vocab,
      merges: candidates.map((c) => [c.a, c.b]),
    },
  };
}
