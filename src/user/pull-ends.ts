import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, renameSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PlanInfeasibleError, RateLimitedError, VerificationError } from '../errors.ts';
import {
  type DialTarget, type EndsFile, type EndsManifestPage, type HostedModelEntry, MANIFEST_TIMEOUT_MS, type ManifestEntry, manifestHash,
  modelHashOf,
  parseEndsManifestPage, parseEndsPiece, type PeerTarget, PIECE_TIMEOUT_MS, request,
} from '../p2p/index.ts';
import { allModels } from './model-index.ts';
import { listPeers } from './peers.ts';

/** How long a puller waits when a host says it asks too fast (its control protocol's per-peer rate), and how often. */
const RATE_LIMITED_WAIT_MS = 250;
const RATE_LIMITED_TRIES = 40;

/** What pullEnds wrote, and from whom. */
export interface PulledEnds {
  /** The directory: config.json, model.safetensors (the ends' weights only) and the tokenizer's files. */
  dir: string;
  name: string;
  hash: string;
  /** The host they came from. */
  host: string;
  /** Bytes of weights received (float32). */
  bytes: number;
}

export interface PullEndsOptions {
  /** The copy to pull, when several are hosted under the name (its manifest hash, or a prefix of it). */
  hash?: string;
  /** Called after each weight chunk arrives: bytes so far of the ends' total. */
  onProgress?: (done: number, total: number) => void;
}

/**
 * Fetches a hosted model's ends (embedding, final norm, head), its config and its tokenizer from one of its hosts into
 * `outDir`, a Hugging Face directory that `loadModel(outDir, { part: 'ends' })` reads. The host's manifest must hash to
 * the hash the index announces, and every chunk must have the sha256 its manifest lists, or the host is refused
 * (VerificationError) and the next one asked. The directory appears whole or not at all (written beside it, then
 * renamed); an `outDir` that exists must be empty. The config and tokenizer files are covered by the model's hash
 * too (modelHashOf): a host that sends others than the model's, or lists others, is refused as one with other weights.
 * @example
 * await pullEnds(node, multiaddr(bootstrap), 'tiny', 'ends/tiny')
 * const ends = await loadModel('ends/tiny', { part: 'ends' })
 */
export async function pullEnds(
  node: Libp2p, validator: DialTarget, name: string, outDir: string, options: PullEndsOptions = {},
): Promise<PulledEnds> {
  if (existsSync(outDir) && readdirSync(outDir).length > 0) throw new InvalidArgumentError(`${outDir} exists and is not empty: pull the ends into a new directory`);
  const entry = await findHosted(node, validator, name, options.hash);
  const online = [...new Set(entry.hosts.filter((h) => h.state === 'online').map((h) => h.peerId))];
  const peers = new Map((await listPeers(node, validator)).map((p) => [p.peerId, p]));
  const hosts = online.flatMap((id) => (peers.has(id) ? [{ peerId: id, addrs: peers.get(id)!.addrs }] : []));
  if (hosts.length === 0) throw new PlanInfeasibleError(`no host of '${name}' (${entry.hash.slice(0, 12)}…) is online now`);
  const failures: Error[] = [];
  for (const host of hosts) {
    const partial = `${outDir}.partial-${process.pid}`;
    rmSync(partial, { recursive: true, force: true });
    try {
      const bytes = await pullFrom(node, host, entry, partial, options.onProgress);
      if (existsSync(outDir)) rmSync(outDir, { recursive: true });
      mkdirSync(dirname(outDir), { recursive: true });
      renameSync(partial, outDir);
      return { dir: outDir, name, hash: entry.hash, host: host.peerId, bytes };
    } catch (err) {
      rmSync(partial, { recursive: true, force: true });
      failures.push(err as Error);
    }
  }
  // one host: its own error; several: the first refusal (a host that lied) before any that was merely unreachable
  throw failures.find((e) => e instanceof VerificationError) ?? failures[failures.length - 1];
}

/** The one copy of `name` the index lists (`hash`: a prefix of its hash, when several are hosted under the name). */
export async function findHosted(node: Libp2p, validator: DialTarget, name: string, hash?: string): Promise<HostedModelEntry> {
  const found = (await allModels(node, validator)).filter((m) => m.name === name && (hash === undefined || m.hash.startsWith(hash)));
  if (found.length === 0) throw new PlanInfeasibleError(`no host announces a model named '${name}'${hash ? ` with hash ${hash.slice(0, 12)}…` : ''}`);
  if (found.length > 1) {
    throw new InvalidArgumentError(`'${name}' is hosted in ${found.length} different copies (hashes ${found.map((m) => m.hash.slice(0, 12)).join(', ')}): name one by its hash`);
  }
  return found[0];
}

/**
 * The ends of a hosted model in `cacheDir`/ends/HASH: pulled (pullEnds) the first time, then read from there (what
 * pullEnds wrote was checked as it came, and appears whole or not at all). Returns the directory and the model's hash.
 */
export async function cachedEnds(
  node: Libp2p, validator: DialTarget, name: string, cacheDir: string, options: PullEndsOptions = {},
): Promise<{ dir: string; hash: string; pulled: PulledEnds | null }> {
  const { hash } = await findHosted(node, validator, name, options.hash);
  const dir = join(cacheDir, 'ends', hash);
  if (existsSync(join(dir, 'config.json')) && existsSync(join(dir, 'model.safetensors'))) return { dir, hash, pulled: null };
  return { dir, hash, pulled: await pullEnds(node, validator, name, dir, { ...options, hash }) };
}

/** Bytes of a weight at float32. */
function float32Bytes(w: ManifestEntry): number {
  return 4 * w.shape.reduce((a, b) => a * b, 1);
}

/** Pulls from one host into `dir`; returns the weight bytes received. Any lie is a VerificationError naming the host. */
async function pullFrom(
  node: Libp2p, host: PeerTarget, entry: HostedModelEntry, dir: string, onProgress?: (done: number, total: number) => void,
): Promise<number> {
  const who = `host …${host.peerId.slice(-8)}`;
  const ask = async (message: Record<string, unknown>, timeoutMs: number) => {
    // a host answers a peer's requests up to its control rate: one over it waits and asks again
    for (let tries = 0; ; tries++) {
      try {
        return await request(node, host, { ...message, model: entry.name, hash: entry.hash }, timeoutMs);
      } catch (err) {
        if (!(err instanceof RateLimitedError) || tries >= RATE_LIMITED_TRIES) throw err;
        await new Promise((r) => setTimeout(r, RATE_LIMITED_WAIT_MS));
      }
    }
  };
  // the manifest, a page at a time: it must hash to the hash the index announces
  let first: EndsManifestPage | null = null;
  const weights: ManifestEntry[] = [];
  for (let page: number | undefined = 0; page !== undefined;) {
    const answer = parseEndsManifestPage(await ask({ type: 'ends-manifest', page }, MANIFEST_TIMEOUT_MS));
    first ??= answer;
    weights.push(...answer.weights);
    page = answer.next;
    if (weights.length > 1_000_000) throw new VerificationError(`${who} sends a manifest without end`);
  }
  const manifest = first!;
  // the weights and the files beside them (their names, sizes and sha256) hash to the model's name
  const got = modelHashOf(manifestHash(weights), manifest.files);
  if (got !== entry.hash) {
    const listed = manifest.files.map((f) => f.name).join(', ');
    throw new VerificationError(
      `${who} sent a manifest of '${entry.name}' (its weights and ${listed || 'no files'}) that hashes to ${got.slice(0, 12)}…, not the announced ${entry.hash.slice(0, 12)}…`,
      { details: { host: host.peerId, announced: entry.hash, got } },
    );
  }
  const byName = new Map(weights.map((w) => [w.name, w]));
  const ends = manifest.ends.map((n) => {
    const w = byName.get(n);
    if (!w) throw new VerificationError(`${who} names '${n}' an end, but its manifest has no such weight`);
    const chunks = Math.max(1, Math.ceil(float32Bytes(w) / manifest.chunkBytes));
    if (w.hashes.length !== chunks) throw new VerificationError(`${who}: '${n}' of ${float32Bytes(w)} bytes lists ${w.hashes.length} chunks, not ${chunks}`);
    return w;
  });
  if (ends.length === 0) throw new VerificationError(`${who} names no ends of '${entry.name}'`);
  mkdirSync(dir, { recursive: true });
  for (const file of manifest.files) writeFileSync(join(dir, file.name), await pullFile(ask, who, file));
  if (!manifest.files.some((f) => f.name === 'config.json')) throw new VerificationError(`${who} sends no config.json for '${entry.name}'`);
  // model.safetensors: the header (every end's name, float32, shape, offsets), then each chunk as it arrives and checks
  const total = ends.reduce((n, w) => n + float32Bytes(w), 0);
  const fd = openSync(join(dir, 'model.safetensors'), 'w');
  let done = 0;
  try {
    writeSync(fd, safetensorsHeader(ends));
    for (const w of ends) {
      const size = float32Bytes(w);
      for (let index = 0; index < w.hashes.length; index++) {
        const length = Math.min(manifest.chunkBytes, size - index * manifest.chunkBytes);
        const chunk = new Uint8Array(Math.max(0, length));
        for (let offset = 0; offset < length;) {
          const piece = parseEndsPiece(await ask({ type: 'ends-chunk', weight: w.name, index, offset }, PIECE_TIMEOUT_MS), 'ends-chunk');
          if (piece.byteLength === 0 || offset + piece.byteLength > length) {
            throw new VerificationError(`${who} sent ${piece.byteLength} bytes of '${w.name}' chunk ${index} at ${offset}; it has ${length}`);
          }
          chunk.set(piece, offset);
          offset += piece.byteLength;
        }
        const sha = createHash('sha256').update(chunk).digest('hex');
        if (sha !== w.hashes[index]) {
          throw new VerificationError(`${who} sent chunk ${index} of '${w.name}' with sha256 ${sha.slice(0, 12)}…; the manifest lists ${w.hashes[index].slice(0, 12)}…`, {
            details: { host: host.peerId, weight: w.name, index },
          });
        }
        writeSync(fd, chunk);
        done += chunk.byteLength;
        onProgress?.(done, total);
      }
    }
  } finally {
    closeSync(fd);
  }
  return done;
}

/** A file beside the weights, a piece at a time, checked against the size and sha256 the model's hash covers. */
async function pullFile(
  ask: (message: Record<string, unknown>, timeoutMs: number) => Promise<Record<string, unknown>>, who: string, file: EndsFile,
): Promise<Uint8Array> {
  const bytes = new Uint8Array(file.bytes);
  for (let offset = 0; offset < file.bytes;) {
    const piece = parseEndsPiece(await ask({ type: 'ends-file', file: file.name, offset }, PIECE_TIMEOUT_MS), 'ends-file');
    if (piece.byteLength === 0 || offset + piece.byteLength > file.bytes) {
      throw new VerificationError(`${who} sent ${piece.byteLength} bytes of ${file.name} at ${offset}; it lists ${file.bytes}`);
    }
    bytes.set(piece, offset);
    offset += piece.byteLength;
  }
  if (createHash('sha256').update(bytes).digest('hex') !== file.sha256) {
    throw new VerificationError(`${who} sent a ${file.name} other than the model's (its sha256 is not the one the model's hash covers)`, {
      details: { host: who, file: file.name },
    });
  }
  return bytes;
}

/** A safetensors header for float32 tensors in this order: 8 bytes of length, then the JSON padded to 8 bytes. */
function safetensorsHeader(weights: readonly ManifestEntry[]): Uint8Array {
  const header: Record<string, unknown> = {};
  let at = 0;
  for (const w of weights) {
    header[w.name] = { dtype: 'F32', shape: w.shape, data_offsets: [at, at + float32Bytes(w)] };
    at += float32Bytes(w);
  }
  const json = new TextEncoder().encode(JSON.stringify(header));
  const body = new Uint8Array(Math.ceil(json.byteLength / 8) * 8).fill(0x20);
  body.set(json);
  const out = new Uint8Array(8 + body.byteLength);
  new DataView(out.buffer).setBigUint64(0, BigInt(body.byteLength), true);
  out.set(body, 8);
  return out;
}
