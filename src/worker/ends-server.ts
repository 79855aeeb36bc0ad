import { InvalidArgumentError, StateDictError, UnauthorizedError } from '../errors.ts';
import type { ModelWeights } from '../models/index.ts';
import {
  CHUNK_BYTES, ENDS_PIECE_BYTES, type EndsFile, type Handler, type HostedSpan, MANIFEST_PAGE_BYTES, MANIFEST_PAGE_ITEMS,
  type ManifestEntry, pageOf, parseModelName,
} from '../p2p/index.ts';
import { type HostedFiles, hostedFilesOf, modelManifest, openModelWeights } from './hosting.ts';
import { listFiles, type ModelFiles } from './model-files.ts';
import type { JobTable } from './jobs.ts';

/** A hosted model's files stay open this long after the last piece read from them (then they are closed, unref'd). */
const IDLE_CLOSE_MS = 30_000;

/** What a host serves of one model it hosts: its manifest, its ends' names, the files beside them, its open weights. */
interface Served {
  hash: string;
  manifest: ManifestEntry[];
  ends: Set<string>;
  files: ModelFiles;
  /** Their names, sizes and sha256, as the model's hash covers them. */
  listed: EndsFile[];
  weights: ModelWeights | null;
  idle: ReturnType<typeof setTimeout> | null;
  /** The last chunk read (a chunk is sent in several pieces). */
  last: { key: string; bytes: Uint8Array } | null;
}

/**
 * The control handlers by which a host lets a user without a checkpoint pull a model's ends (`tensorlink pull-ends`):
 * 'ends-manifest' {model, hash?, page?} → a page of the manifest (every weight's name, shape and chunk hashes, from
 * which the user recomputes the announced hash), the ends' names and the files beside them; 'ends-chunk' {model, hash,
 * weight, index, offset} → up to ENDS_PIECE_BYTES of an end's float32 chunk; 'ends-file' {model, hash, file, offset} →
 * a piece of config.json or the tokenizer's files. Only models this worker hosts (online, `--host` or `--host-auto`),
 * and of them only the ends. Blocks are never sent: they stay with their hosts. `filesOf`: what a hosted span was
 * loaded from, and the files its hash covers (hostedFilesOf; tests give their own).
 */
export function endsHandlers(
  jobs: JobTable, filesOf: (span: HostedSpan) => HostedFiles | undefined = hostedFilesOf,
): Record<string, Handler> {
  const served = new Map<string, Promise<Served>>();

  /** The files and hash of a model hosted here by this name (and hash, when named). */
  const hostedAs = (body: Record<string, unknown>): { spec: { name: string } & HostedFiles; hash: string } => {
    const name = parseModelName(body.model, 'model');
    const hash = body.hash === undefined ? undefined : String(body.hash);
    for (const j of jobs.values()) {
      const span = j.hosted;
      if (!span || span.name !== name || span.state !== 'online' || (hash !== undefined && span.hash !== hash)) continue;
      const files = filesOf(span);
      if (files !== undefined) return { spec: { name, ...files }, hash: span.hash };
    }
    throw new UnauthorizedError(`this worker hosts no model '${name}'${hash ? ` with hash ${hash.slice(0, 12)}…` : ''}; ask one of its hosts`);
  };

  const open = (spec: HostedFiles, hash: string): Promise<Served> => {
    const key = `${spec.path}\u0000${hash}`;
    let entry = served.get(key);
    if (!entry) {
      entry = (async () => {
        const weights = openModelWeights(spec.path);
        try {
          const manifest = await modelManifest(weights);
          const ends = new Set(weights.partWeights('ends').map((w) => w.name));
          return { hash, manifest, ends, files: spec.files, listed: listFiles(spec.files), weights, idle: null, last: null };
        } catch (err) {
          weights.close();
          throw err;
        }
      })();
      entry.catch(() => served.delete(key));
      served.set(key, entry);
    }
    return entry;
  };

  /** The model's weights, open (again, if they were closed while idle) until IDLE_CLOSE_MS after this read. */
  const weightsOf = (s: Served, spec: { path: string }): ModelWeights => {
    s.weights ??= openModelWeights(spec.path);
    if (s.idle) clearTimeout(s.idle);
    s.idle = setTimeout(() => {
      s.weights?.close();
      s.weights = null;
      s.last = null;
    }, IDLE_CLOSE_MS);
    s.idle.unref();
    return s.weights;
  };

  const offsetOf = (v: unknown, size: number, what: string): number => {
    if (!Number.isSafeInteger(v) || (v as number) < 0 || (v as number) >= Math.max(1, size)) {
      throw new InvalidArgumentError(`${what} must be an offset in [0, ${size})`);
    }
    return v as number;
  };
  const piece = (type: string, bytes: Uint8Array, offset: number) => ({
    type, data: Buffer.from(bytes.buffer, bytes.byteOffset + offset, Math.min(ENDS_PIECE_BYTES, bytes.byteLength - offset)).toString('base64'),
  });

  return {
    'ends-manifest': async (m) => {
      const { spec, hash } = hostedAs(m);
      const s = await open(spec, hash);
      const cursor = m.page === undefined ? 0 : Number(m.page);
      if (!Number.isSafeInteger(cursor) || cursor < 0) throw new InvalidArgumentError('page must be a cursor from a previous page (0 first)');
      const { items, next } = pageOf(s.manifest, cursor, { items: MANIFEST_PAGE_ITEMS, bytes: MANIFEST_PAGE_BYTES });
      return {
        type: 'ends-manifest', name: spec.name, hash, chunkBytes: CHUNK_BYTES, ends: [...s.ends], files: s.listed, weights: items,
        ...(next === undefined ? {} : { next }),
      };
    },
    'ends-chunk': async (m) => {
      const { spec, hash } = hostedAs(m);
      const s = await open(spec, hash);
      const weight = String(m.weight);
      if (!s.ends.has(weight)) throw new UnauthorizedError(`'${weight}' is not one of the model's ends (${[...s.ends].join(', ')}): only the ends are sent`);
      const chunks = s.manifest.find((w) => w.name === weight)?.hashes.length ?? 0;
      if (!Number.isSafeInteger(m.index) || (m.index as number) < 0 || (m.index as number) >= chunks) {
        throw new InvalidArgumentError(`index must be a chunk of '${weight}' in [0, ${chunks})`);
      }
      const key = `${weight}#${m.index as number}`;
      if (s.last?.key !== key) {
        const weights = weightsOf(s, spec);
        // a chunk read without scratch is a fresh array (a GGUF's is a view of the weight it keeps): kept for the next pieces
        s.last = { key, bytes: weights.chunk(weight, m.index as number) };
      } else weightsOf(s, spec);
      const bytes = s.last.bytes;
      return piece('ends-chunk', bytes, offsetOf(m.offset, bytes.byteLength, 'offset'));
    },
    'ends-file': async (m) => {
      const { spec, hash } = hostedAs(m);
      const s = await open(spec, hash);
      const bytes = s.files.get(m.file as EndsFile['name']);
      if (!bytes) throw new StateDictError(`this host has no '${String(m.file)}' for '${spec.name}' (it has ${[...s.files.keys()].join(', ')})`);
      return piece('ends-file', bytes, offsetOf(m.offset, bytes.byteLength, 'offset'));
    },
  };
}
