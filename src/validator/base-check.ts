/**
 * A job over a hosted model (an adapter trained over its hosts) computes with the hosts' frozen base. Its records sign
 * the hash of the weights the host holds, and an audit re-runs a record with the weights the host hands over: a host
 * that computes with a cheaper base (`--fault substitute:int4`) would hand that base over and pass. So the base a host
 * hands over is checked against the model the user asked for, by its name: the model's manifest (every weight's chunk
 * hashes at float32), fetched from the host itself and taken only if it hashes to that name (modelHashOf), and each
 * frozen weight of the section hashed against it.
 */
import { createHash } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { VerificationError } from '../errors.ts';
import { configFromHF, createModel } from '../models/index.ts';
import {
  CHUNK_BYTES, type ManifestEntry, manifestHash, modelHashOf, parseEndsManifestPage, type PeerRecord, type PeerTarget, request,
} from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';

/** The model a job's base must be: its name (what its hosts serve it as), hash, and the format the job holds it in. */
export interface JobBase {
  name: string;
  hash: string;
  format: string;
}

interface Manifest {
  chunkBytes: number;
  weights: Map<string, ManifestEntry>;
}

/** Manifests by model hash, each verified against it (a hash names one model), the most recent MAX_MANIFESTS. */
const manifests = new Map<string, Manifest>();
const MAX_MANIFESTS = 16;
/** Pages of a manifest read at most (each at most a control frame), and weights listed at most. */
const MAX_PAGES = 64;
const MAX_WEIGHTS = 100_000;

/**
 * The manifest of model `base`, from `host`, taken only if it hashes to the model's name and lists its chunks at the
 * project's CHUNK_BYTES (a host cannot make honest hosts' weights look wrong by another chunking). Only a verified one
 * is kept for the audits after it.
 */
export async function baseManifest(node: Libp2p, host: PeerTarget, base: JobBase): Promise<Manifest> {
  const known = manifests.get(base.hash);
  if (known) return known;
  const manifest = await fetchManifest(node, host, base);
  manifests.set(base.hash, manifest);
  if (manifests.size > MAX_MANIFESTS) manifests.delete(manifests.keys().next().value!);
  return manifest;
}

async function fetchManifest(node: Libp2p, host: PeerTarget, base: JobBase): Promise<Manifest> {
  const weights: ManifestEntry[] = [];
  let first: ReturnType<typeof parseEndsManifestPage> | null = null;
  for (let page: number | undefined = 0, pages = 0; page !== undefined; pages++) {
    if (pages >= MAX_PAGES || weights.length > MAX_WEIGHTS) throw new VerificationError(`the manifest of ${base.name} runs past ${MAX_PAGES} pages`);
    const answer = parseEndsManifestPage(await request(node, host, { type: 'ends-manifest', model: base.name, hash: base.hash, page }));
    if (answer.chunkBytes !== CHUNK_BYTES) throw new VerificationError(`the manifest lists chunks of ${answer.chunkBytes} bytes, not ${CHUNK_BYTES}`);
    first ??= answer;
    weights.push(...answer.weights);
    page = answer.next;
  }
  const got = modelHashOf(manifestHash(weights), first!.files);
  if (got !== base.hash) throw new VerificationError(`the manifest handed over hashes to ${got.slice(0, 12)}…, not model ${base.hash.slice(0, 12)}…`);
  return { chunkBytes: CHUNK_BYTES, weights: new Map(weights.map((w) => [w.name, w])) };
}

/**
 * The name `worker` hosts model `hash` under, from its own announcement in the registry (not the user's word: the host
 * answers for a model by the name it serves it as), or null when it announces no such span.
 */
export function hostedName(peers: readonly PeerRecord[], worker: string, hash: string): string | null {
  return peers.find((p) => p.peerId === worker)?.hosts?.find((h) => h.hash === hash)?.name ?? null;
}

/** The sha256 of each `chunkBytes` piece of a float32 tensor's bytes, as a manifest lists them. */
function chunkHashes(t: Tensor, chunkBytes: number): string[] {
  const data = t.data as Float32Array;
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  const out: string[] = [];
  for (let at = 0; at < Math.max(1, bytes.byteLength); at += chunkBytes) {
    out.push(createHash('sha256').update(bytes.subarray(at, Math.min(bytes.byteLength, at + chunkBytes))).digest('hex'));
  }
  return out;
}

/**
 * Why the frozen weights `weights` a host handed over for layers `range` of a job over model `base` are not that
 * model's, or null when they are: every weight of the section but the adapter's must be there, and at float32 (the
 * format the job asked for) its chunks must hash to the manifest's. A base held compact (int8, int4, bf16) is not
 * checked yet: its packed bytes are not the manifest's float32 ones.
 */
export function baseMismatch(
  manifest: Manifest, base: JobBase, config: Record<string, unknown>, range: readonly [number, number],
  weights: ReadonlyMap<string, Tensor>,
): string | null {
  if (base.format !== 'f32') return null;
  const section = createModel(configFromHF(config), { section: [range[0], range[1]], init: false });
  for (const name of section.hfStateDict().keys()) {
    const entry = manifest.weights.get(name);
    if (!entry) return `'${name}' of its section is not a weight of model ${base.name}`;
    const t = weights.get(name);
    if (!t) return `it handed over no '${name}'`;
    if (t.packed || t.dtype !== 'float32') return `its '${name}' is ${t.packed ? t.packed.format : t.dtype}, not the model's float32: it computes with another base`;
    const hashes = chunkHashes(t, manifest.chunkBytes);
    if (hashes.length !== entry.hashes.length || hashes.some((h, i) => h !== entry.hashes[i])) {
      return `its '${name}' is not model ${base.name}'s (${base.hash.slice(0, 12)}…): it computes with another base`;
    }
  }
  return null;
}
