import { basename, extname, resolve } from 'node:path';
import { createHash } from 'node:crypto';
import { InvalidArgumentError, UnauthorizedError } from '../errors.ts';
import {
  CheckpointWeights, configToHF, defaultCacheDir, GGUFWeights, heldBytes, isGGUF, loadModel, type ModelConfig, modelLayers,
  type ModelWeights, partLayers, weightsWithAdapter,
} from '../models/index.ts';
import {
  CHUNK_BYTES, hostedJobId, type HostedSpan, type Logger, type ManifestEntry, manifestHash, modelHashOf, parseSessionId,
} from '../p2p/index.ts';
import { packedTensor, type Tensor, type WeightFormat } from '../tensor/index.ts';
import { checkpointHash } from '../verify/index.ts';
import type { FaultInjector } from './fault.ts';
import type { JobTable } from './jobs.ts';
import type { MemoryBudget } from './memory.ts';
import { listFiles, type ModelFiles, modelFiles } from './model-files.ts';
import { spanThroughput } from './placement.ts';
import { copyReserve } from './release.ts';

/** What `worker --host [NAME=]PATH[:FIRST-LAST]` asks for: a model's name, its files, and the blocks to host (null: all). */
export interface HostSpec {
  name: string;
  path: string;
  blocks: [number, number] | null;
}

/** Parses a `--host` value: `[NAME=]DIR|FILE.gguf[:FIRST-LAST]` (blocks from 0, inclusive; NAME defaults to the file's name). */
export function parseHostSpec(value: string): HostSpec {
  const named = /^([A-Za-z0-9._-]{1,64})=(.+)$/.exec(value);
  let path = named ? named[2] : value;
  let blocks: [number, number] | null = null;
  const range = /^(.*):(\d+)-(\d+)$/.exec(path);
  if (range) {
    path = range[1];
    blocks = [Number(range[2]), Number(range[3])];
    if (blocks[0] > blocks[1]) throw new InvalidArgumentError(`--host ${value}: blocks ${blocks[0]}-${blocks[1]} run backwards`);
  }
  const name = named ? named[1] : basename(resolve(path), extname(path) === '.gguf' ? '.gguf' : '');
  if (!/^[A-Za-z0-9._-]{1,64}$/.test(name)) throw new InvalidArgumentError(`--host ${value}: '${name}' cannot name a model; say NAME=${path}`);
  return { name, path, blocks };
}

/** The files of a model seen weight by weight: a checkpoint directory or a GGUF file. */
export function openModelWeights(path: string, cacheDir: string | null = defaultCacheDir()): ModelWeights {
  if (isGGUF(path)) return GGUFWeights.open(path, { chunkBytes: CHUNK_BYTES });
  return CheckpointWeights.open(path, { chunkBytes: CHUNK_BYTES, cacheDir });
}

/** Every weight of a model with its shape and chunk hashes at float32 (the manifest its hash is of), in name order. */
export async function modelManifest(weights: ModelWeights): Promise<ManifestEntry[]> {
  const all = weights.partWeights([0, weights.config.layers + 3]).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const out: ManifestEntry[] = [];
  for (const w of all) out.push({ name: w.name, shape: w.shape, hashes: await weights.hashes(w.name) });
  return out;
}

/**
 * The name of a model: the hash of its weights' manifest (every weight's name, shape and chunk addresses at float32, in
 * name order; see manifestHash) and of the files a user pulls beside them (modelHashOf). Two copies with the same bytes
 * have the same hash wherever they are and whatever part of them a host holds; a directory's chunk hashes are cached,
 * so a host started again does not read its files twice.
 */
export async function modelHash(weights: ModelWeights, files: ModelFiles): Promise<string> {
  return modelHashOf(manifestHash(await modelManifest(weights)), listFiles(files));
}

/** The FLOPs a token costs in blocks `first` to `last` of a model (from the config: no weights are made). */
function spanFlopsPerToken(config: ModelConfig, first: number, last: number): number {
  return partLayers(modelLayers(config), [first + 1, last + 2]).reduce((n, l) => n + l.profile().flopsPerToken, 0);
}

/**
 * Loads the blocks a host spec names from its files, in `format` (null: float32), into the worker's memory budget,
 * and registers them as a hosted span any peer may open sessions on. Returns the span as the worker announces it.
 */
export async function hostModel(
  spec: HostSpec,
  format: WeightFormat | null,
  ctx: {
    jobs: JobTable; memory: MemoryBudget; self: string; log: Logger; cacheDir?: string | null;
    /** The host's measured speed, GFLOP/s: its span's throughput is what it pushes through the span (spanThroughput). */
    gflops?: number;
    /** Validators that may fetch what re-running a session's steps needs (its bootstrap validator). */
    verifiers?: string[];
    /** A worker that cheats on purpose (`--fault substitute:…` computes with another model than it announces). */
    fault?: FaultInjector | null;
  },
): Promise<HostedSpan> {
  const weights = openModelWeights(spec.path, ctx.cacheDir);
  // read once: the hash covers these bytes, and the ends server sends them
  const files = modelFiles(spec.path);
  let hash: string;
  let blocks: number;
  const config = weights.config;
  try {
    hash = await modelHash(weights, files);
    blocks = config.layers;
  } finally {
    if (weights instanceof CheckpointWeights) weights.saveCache();
    weights.close();
  }
  const [first, last] = spec.blocks ?? [0, blocks - 1];
  if (last >= blocks) throw new InvalidArgumentError(`--host ${spec.path}: the model has blocks 0-${blocks - 1}, not ${first}-${last}`);
  const span: HostedSpan = {
    name: spec.name, hash, blocks, layers: [first, last], format: format ?? 'f32', state: 'joining',
    ...(ctx.gflops === undefined ? {} : { throughput: spanThroughput(ctx.gflops, spanFlopsPerToken(config, first, last)) }),
  };
  const jobId = hostedJobId(span);
  const job = ctx.jobs.host(jobId, ctx.self, span);
  for (const v of ctx.verifiers ?? []) job.verifiers.add(v);
  try {
    // our layers: 0 the embedding, 1..L the blocks, L + 1 the final norm, L + 2 the head
    const range: [number, number] = [first + 1, last + 2];
    const compact = format === null ? {} : format === 'bf16' ? { dtype: 'bf16' as const } : { quantize: format };
    const model = await loadModel(spec.path, { part: range, ...compact });
    const bytes = heldBytes(model);
    ctx.memory.holdAll(jobId, { weights: bytes, runtime: copyReserve(model, format) }, `${spec.name} blocks ${first}-${last} in ${span.format}`);
    // its records name the config as a user states it (Hugging Face form), as a job's do
    const configHash = createHash('sha256').update(JSON.stringify(configToHF(model.config))).digest('hex');
    job.section = { model, range, configHash, held: { format: span.format, bytes }, sessions: new Map() };
    if (ctx.fault?.fault.kind === 'substitute') {
      // it signs the hash of what it loaded and announced, and computes with something else
      job.section.weightsHash = checkpointHash(model);
      const keep = (t: Tensor) => (t.packed ? packedTensor(t.packed) : t.detach().clone());
      const kept = [...weightsWithAdapter(model)].map(([n, t]): [string, Tensor] => [n, keep(t)]);
      job.section.announced = new Map(kept);
      ctx.fault.substitute(model);
    }
    span.state = 'online';
    hostedFiles.set(span, { path: spec.path, files });
    ctx.log.info('hosting', { model: spec.name, hash: hash.slice(0, 12), blocks: [first, last], format: span.format, bytes });
    return span;
  } catch (err) {
    ctx.jobs.remove(jobId);
    throw err;
  }
}

/** What a hosted span was loaded from: its checkpoint directory or GGUF file, and the files its hash covers. */
export interface HostedFiles {
  path: string;
  files: ModelFiles;
}

/** The files of each span hosted here (a job's `hosted` record → what it was loaded from): what the ends server serves. */
const hostedFiles = new WeakMap<HostedSpan, HostedFiles>();

/** What a span hosted here (by hostModel) was loaded from. */
export function hostedFilesOf(span: HostedSpan): HostedFiles | undefined {
  return hostedFiles.get(span);
}

/** Requests a hosted span takes, from anyone: a session's steps, how far it has come, and closing it. */
export const HOSTED_REQUESTS = new Set(['forward', 'truncate', 'session-status', 'close']);
/** Requests a hosted span takes from its validators only: what re-running a session's step needs, named as its record names it. */
export const HOSTED_AUDITS = new Set(['audit-index', 'audit-part']);

/**
 * The session a request on a hosted span means: the sender's own (its peer id is part of the key), so no other peer
 * can step it, read its cache or close it. A chained forward is refused: a hosted span answers each step to its sender.
 */
export function hostedRequest(
  type: string, body: Record<string, unknown>, from: string, verifiers: ReadonlySet<string>,
): Record<string, unknown> {
  if (HOSTED_AUDITS.has(type) && verifiers.has(from)) return body;
  if (!HOSTED_REQUESTS.has(type)) throw new UnauthorizedError(`a hosted model takes only session requests (${[...HOSTED_REQUESTS].join(', ')}), not '${type}'`);
  if ((Array.isArray(body.route) && body.route.length > 0) || body.replyTo !== undefined) {
    throw new InvalidArgumentError('a hosted model answers each step to its sender: send it without a route');
  }
  const sessionId = parseSessionId(body.sessionId);
  return { ...body, sessionId: `${createHash('sha256').update(from).digest('hex').slice(0, 24)}/${sessionId}` };
}
