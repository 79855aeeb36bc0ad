import { createHash } from 'node:crypto';
import { InvalidMessageError } from '../../../errors.ts';
import { int, list, obj } from '../../schema.ts';
import { ENDS_FILES, ENDS_PIECE_BYTES, MAX_ENDS_FILE_BYTES } from './constants.ts';

/** One weight of a model's manifest: its name, its shape, and the sha256 of each of its float32 chunks, in order. */
export interface ManifestEntry {
  name: string;
  shape: number[];
  hashes: string[];
}

/** A file a host sends beside the weights (config.json, the tokenizer's), its size and sha256. */
export interface EndsFile {
  name: (typeof ENDS_FILES)[number];
  bytes: number;
  sha256: string;
}

/**
 * One page of a hosted model's manifest as its host sends it: the model's name and hash, the chunk size its hashes
 * are of, which weights are its ends, the files beside them, and a page of every weight's entry (`next`: the cursor
 * of the following page). The entries of all pages hash (manifestHash) to the weights' hash, which with the files
 * hashes (modelHashOf) to the model's.
 */
export interface EndsManifestPage {
  name: string;
  hash: string;
  chunkBytes: number;
  ends: string[];
  files: EndsFile[];
  weights: ManifestEntry[];
  next?: number;
}

/**
 * The identity of a model's weights: the sha256 of its manifest, one line `name[shape]:hash,hash,…` per weight in name
 * order. A puller recomputes it from the entries a host sends (and the model's hash from it and the files: modelHashOf).
 */
export function manifestHash(entries: readonly ManifestEntry[]): string {
  const sorted = [...entries].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const h = createHash('sha256');
  for (const w of sorted) h.update(`${w.name}[${w.shape.join(',')}]:${w.hashes.join(',')}\n`);
  return h.digest('hex');
}

/**
 * The hash that names a model: the sha256 of its weights' hash (manifestHash) and of each file a user pulls beside them
 * (config.json, the tokenizer's: name, size and sha256 of its bytes as served, in name order). A host can change neither
 * the weights nor a file, nor add or drop one, without changing the name a user asked for.
 */
export function modelHashOf(weightsHash: string, files: readonly EndsFile[]): string {
  const h = createHash('sha256').update(`tensorlink-model/2\nweights:${weightsHash}\n`);
  for (const f of [...files].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) h.update(`${f.name}:${f.bytes}:${f.sha256}\n`);
  return h.digest('hex');
}

const SHA256 = /^[0-9a-f]{64}$/;

function sha(v: unknown, what: string): string {
  if (typeof v !== 'string' || !SHA256.test(v)) throw new InvalidMessageError(`${what} must be a sha256 in hex`);
  return v;
}

function text(v: unknown, what: string, max = 256): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > max) throw new InvalidMessageError(`${what} must be a string of 1–${max} characters`);
  return v;
}

/** A host's answer to 'ends-manifest', checked field by field (a host is not trusted). */
export function parseEndsManifestPage(m: Record<string, unknown>): EndsManifestPage {
  if (m.type !== 'ends-manifest') throw new InvalidMessageError(`expected an ends-manifest answer, got '${String(m.type)}'`);
  const weights = list(m.weights, 'weights', 10_000, (v, what) => {
    const o = obj(v, what);
    return {
      name: text(o.name, `${what}.name`),
      shape: list(o.shape, `${what}.shape`, 8, (d, where) => int(d, where, 0, 2 ** 40)),
      hashes: list(o.hashes, `${what}.hashes`, 1_000_000, (x, where) => sha(x, where)),
    };
  });
  const files = list(m.files, 'files', ENDS_FILES.length, (v, what) => {
    const o = obj(v, what);
    const name = o.name as EndsFile['name'];
    if (!ENDS_FILES.includes(name)) throw new InvalidMessageError(`${what}.name must be one of ${ENDS_FILES.join(', ')}`);
    return { name, bytes: int(o.bytes, `${what}.bytes`, 0, MAX_ENDS_FILE_BYTES), sha256: sha(o.sha256, `${what}.sha256`) };
  });
  return {
    name: text(m.name, 'name', 64),
    hash: sha(m.hash, 'hash'),
    chunkBytes: int(m.chunkBytes, 'chunkBytes', 4, 2 ** 30),
    ends: list(m.ends, 'ends', 16, (v, what) => text(v, what)),
    files,
    weights,
    ...(m.next === undefined ? {} : { next: int(m.next, 'next', 1) }),
  };
}

/** A host's answer to 'ends-chunk' or 'ends-file': a piece of bytes (base64 on the wire), ENDS_PIECE_BYTES at most. */
export function parseEndsPiece(m: Record<string, unknown>, type: 'ends-chunk' | 'ends-file'): Uint8Array {
  if (m.type !== type) throw new InvalidMessageError(`expected an ${type} answer, got '${String(m.type)}'`);
  if (typeof m.data !== 'string' || m.data.length > Math.ceil(ENDS_PIECE_BYTES / 3) * 4) {
    throw new InvalidMessageError(`${type}.data must be base64 of at most ${ENDS_PIECE_BYTES} bytes`);
  }
  const bytes = Buffer.from(m.data, 'base64');
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
