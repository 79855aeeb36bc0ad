import { InvalidMessageError, UnauthorizedError } from '../../errors.ts';
import {
  adaptModel, adapterBytes, adapterState, type CausalLM, compactWeight, configFromHF, createModel, heldBytes, type ModelConfig, partBytes,
  sectionParts, weightBytes, weightsWithAdapter,
} from '../../models/index.ts';
import {
  CHUNK_BYTES, expectTensors, jobConfigHash, type LoadRequest, parseAssign, parseChunk, parseLoad, parseManifest, type StageAssignment,
  type WeightEntry,
} from '../../p2p/index.ts';
import { holdPacked, packedFromBytes, type Tensor } from '../../tensor/index.ts';
import type { ChunkPlace, JobEntry, Loading } from '../jobs.ts';
import { copyReserve } from '../release.ts';
import { sectionOverHosted } from './hosted-base.ts';
import { control, NONE, type StageContext, type StageHandler } from './types.ts';

/**
 * Loading a section: `load` reserves its memory and builds it empty, each `manifest` lists
 * some of its weights as chunk addresses (the worker fills those it holds and asks for the
 * rest), each `chunk` is written into its weight as it arrives, and `assemble` checks that
 * nothing is missing. Only the job's owner loads; the job ends with the stream it loaded over.
 * A compact job's matrices arrive packed in its format (bf16, int8, int4): the worker reserves
 * and holds only their packed bytes, and its store keeps and reuses those chunks as it does
 * float32 ones.
 */
export const loadHandlers: Record<string, StageHandler> = {
  load: {
    run: ({ body, job, bindToStream }, { memory, jobs, fault }) => {
      const request = parseLoad(body);
      const config = configFromHF(request.config);
      checkUpstream(job.jobId, request.assignment, request.upstream);
      // --fault stale-adapter: new factors loaded over a section it holds are quietly not taken
      const stale = fault?.fault.kind === 'stale-adapter' && job.section && request.adapter
        ? new Map([...adapterState(job.section.model)].map(([n, t]) => [n, (t.data as Float32Array).slice()]))
        : undefined;
      // a new load replaces whatever the job held: its section, training state, caches and their budget
      job.section = undefined;
      job.loading = undefined;
      memory.release(job.jobId);
      // the range and the budget first: nothing is allocated for a section that is not in the model or does not fit
      sectionParts(config.layers, request.section, config.tieWordEmbeddings);
      const what = `section [${request.section[0]}, ${request.section[1]}) of ${config.arch}`;
      if (request.base) return loadOverHosted(request, config, what, { job, bindToStream, memory, jobs }, stale);
      const format = request.format ?? null;
      if (!format) memory.hold(job.jobId, 'weights', partBytes(config, request.section), what);
      let model;
      try {
        // a compact section is built empty (its float32 buffers are never written, so never resident) and its budget
        // counts the bytes it will hold: its matrices packed
        model = createModel(config, { section: request.section, ...(format ? { init: false } : {}) });
        if (format) {
          const bytes = [...model.hfStateDict()].reduce((sum, [name, t]) => sum + weightBytes(name, t.shape, format), 0);
          // and what the backend will keep beside them once they compute (onnxruntime's prepacked copies)
          memory.holdAll(job.jobId, { weights: bytes, runtime: copyReserve(model, format) }, `${what} in ${format}`);
        }
        if (request.adapter) {
          // the base frozen, LoRA factors on the layers the adapter targets (their values arrive with the base's weights)
          adaptModel(model, request.adapter, { part: true });
          memory.add(job.jobId, 'weights', adapterBytes(model), `the adapter on ${what}`);
        }
      } catch (err) {
        memory.release(job.jobId);
        throw err;
      }
      return startLoading(job, request, model, weightsWithAdapter(model), bindToStream, {
        ...(request.format ? { format: request.format } : {}), ...(stale ? { stale } : {}),
      });
    },
  },
  manifest: {
    run: async ({ body, job }, context) => {
      const loading = loadingOf(job);
      const entries = parseManifest(body);
      const names = new Set<string>();
      for (const e of entries) {
        if (names.has(e.name)) throw new InvalidMessageError(`'${e.name}' is listed twice`);
        names.add(e.name);
        checkEntry(loading, e);
      }
      // listed before any chunk is read: a manifest arriving while this one reads cannot list them again
      for (const e of entries) loading.listed.set(e.name, e);
      const need: string[] = [];
      for (const e of entries) {
        const into = destination(loading, e.name);
        const size = into.byteLength;
        for (const [i, sha] of e.chunks.entries()) {
          const place = { into, offset: i * CHUNK_BYTES, bytes: Math.min(CHUNK_BYTES, size - i * CHUNK_BYTES) };
          const waiting = loading.waiting.get(sha);
          if (waiting) {
            // one address is one content: it cannot fill places of different sizes
            if (waiting[0].bytes !== place.bytes) throw new InvalidMessageError(`chunk ${sha.slice(0, 12)}… is listed for places of ${waiting[0].bytes} and ${place.bytes} bytes`);
            waiting.push(place);
            continue;
          }
          // reading and re-hashing what it holds takes time: other requests are served between chunks
          await new Promise<void>((resolve) => setImmediate(resolve));
          const held = context.store.get(sha) ?? context.models?.read(sha) ?? null;
          if (held && held.length === place.bytes) {
            fill(place, held);
            loading.reused += place.bytes;
            context.work.weightBytesReused += place.bytes;
          } else {
            loading.waiting.set(sha, [place]);
            need.push(sha);
          }
        }
      }
      return control('need', { chunks: need });
    },
  },
  chunk: {
    maxTensors: 1,
    run: ({ body, tensors, job }, { store, work }) => {
      const { sha } = parseChunk(body);
      const [chunk] = expectTensors('chunk', tensors, 1);
      const loading = loadingOf(job);
      // only chunks a manifest listed, of the size their place in the weight gives, are taken: a peer cannot fill the store
      const places = loading.waiting.get(sha);
      if (!places) throw new InvalidMessageError('a chunk no manifest lists (or one that already arrived)');
      const expected = places[0].bytes;
      if (chunk.bytes.length !== expected) throw new InvalidMessageError(`chunk ${sha.slice(0, 12)}… must hold ${expected} bytes, not ${chunk.bytes.length}`);
      store.put(sha, chunk.bytes); // checks the hash (and keeps the chunk when the worker has a data directory)
      for (const place of places) fill(place, chunk.bytes);
      loading.waiting.delete(sha);
      loading.received += expected;
      work.weightBytesReceived += expected;
      return NONE;
    },
  },
  assemble: {
    run: ({ job }, { memory }) => {
      const loading = loadingOf(job);
      const unlisted = [...loading.targets.keys()].filter((n) => !loading.listed.has(n));
      if (unlisted.length > 0) throw new InvalidMessageError(`${unlisted.length} weights of the section were in no manifest (the first: '${unlisted[0]}')`);
      if (loading.waiting.size > 0) {
        const first = loading.waiting.keys().next().value!;
        throw new InvalidMessageError(`${loading.waiting.size} chunks of the section have not arrived (the first: ${first.slice(0, 12)}…)`);
      }
      job.loading = undefined;
      if (loading.stale) {
        for (const [n, t] of adapterState(loading.model)) {
          const old = loading.stale.get(n);
          if (old && old.length === t.data.length) (t.data as Float32Array).set(old);
        }
      }
      // a compact section's matrices are held as the packed bytes that arrived (frozen; their float32 buffers let go)
      const format = loading.format;
      if (format) {
        for (const [name, bytes] of loading.packed) {
          const t = loading.targets.get(name)!;
          holdPacked(t, packedFromBytes(format, t.shape[0], t.shape[1], bytes));
        }
      }
      // over a hosted base, the job holds its factors alone (the base is the host's, counted once under its span)
      const bytes = (loading.shared ? 0 : heldBytes(loading.model)) + adapterBytes(loading.model);
      if (format) memory.hold(job.jobId, 'weights', bytes, `section [${loading.range[0]}, ${loading.range[1]}) in ${format}`);
      const held = { format: loading.shared?.format ?? format ?? 'f32' as const, bytes };
      job.section = {
        model: loading.model, range: loading.range, configHash: loading.configHash, held, sessions: new Map(),
        ...(loading.shared ? { shared: loading.shared } : {}),
      };
      // the previous stage of a chain may pass activations on for this job
      job.upstream = loading.upstream;
      return control('loaded', { params: loading.model.numParameters(), received: loading.received, reused: loading.reused });
    },
  },
  // a new assignment (a stage of the job moved to another worker): whom this section sends to and hears from
  assign: {
    run: ({ body, job }) => {
      const request = parseAssign(body);
      checkUpstream(job.jobId, request.assignment, request.upstream);
      job.assignment = request.assignment;
      if (job.loading) job.loading.upstream = request.upstream;
      else job.upstream = request.upstream;
      return control('assigned');
    },
  },
};

/** The job starts loading `model`: the weights in `targets` are what its manifests must list and its chunks fill. */
function startLoading(
  job: JobEntry, request: LoadRequest, model: CausalLM, targets: Map<string, Tensor>, bindToStream: () => void, extra: Partial<Loading>,
) {
  job.assignment = request.assignment;
  for (const v of request.verifiers) job.verifiers.add(v);
  job.loading = {
    model, targets, packed: new Map(), listed: new Map(), waiting: new Map(), received: 0, reused: 0, upstream: request.upstream,
    range: request.section, configHash: jobConfigHash(request.config, request.adapter, request.base ? { hash: request.base, format: request.format ?? 'f32' } : undefined),
    ...extra,
  };
  bindToStream();
  return control('loading', { weights: targets.size });
}

/**
 * A load over blocks this worker hosts (`base`): the section shares the hosted weights and holds only the job's
 * adapter, whose factors are all its manifests list; its budget counts the factors alone.
 */
function loadOverHosted(
  request: LoadRequest, config: ModelConfig, what: string,
  ctx: { job: JobEntry; bindToStream: () => void; memory: StageContext['memory']; jobs: StageContext['jobs'] }, stale?: Map<string, Float32Array>,
) {
  const { model, span } = sectionOverHosted(ctx.jobs, request, config);
  ctx.memory.hold(ctx.job.jobId, 'weights', adapterBytes(model), `the adapter on ${what} over hosted ${span.name}`);
  return startLoading(ctx.job, request, model, adapterState(model), ctx.bindToStream, { shared: span, ...(stale ? { stale } : {}) });
}

function loadingOf(job: JobEntry): Loading {
  if (!job.loading) throw new InvalidMessageError(`job ${job.jobId} is not loading a section`);
  return job.loading;
}

/** A manifest entry must name a weight of the section, once, with its shape and its number of chunks. */
function checkEntry(loading: Loading, e: WeightEntry): void {
  const t: Tensor | undefined = loading.targets.get(e.name);
  if (!t) throw new InvalidMessageError(`'${e.name}' is not a weight of this section`);
  if (loading.listed.has(e.name)) throw new InvalidMessageError(`'${e.name}' was listed by an earlier manifest`);
  if (t.shape.length !== e.shape.length || t.shape.some((d, i) => d !== e.shape[i])) {
    throw new InvalidMessageError(`'${e.name}' has shape [${t.shape}] in this section, the manifest says [${e.shape}]`);
  }
  // a compact job's matrices travel packed in its format, everything else in float32: the manifest must say which
  const travel = loading.format && compactWeight(e.name, t.shape) ? loading.format : undefined;
  if (e.format !== travel) {
    throw new InvalidMessageError(`'${e.name}' travels ${travel ? `packed in ${travel}` : 'in float32'} for this section, the manifest says ${e.format ?? 'float32'}`);
  }
  const chunks = Math.max(1, Math.ceil(weightBytes(e.name, t.shape, travel ?? null) / CHUNK_BYTES));
  if (e.chunks.length !== chunks) throw new InvalidMessageError(`'${e.name}' is ${chunks} chunks of ${CHUNK_BYTES} bytes, the manifest lists ${e.chunks.length}`);
}

/** The bytes a weight's chunks are written into: its float32 buffer, or (a compact matrix) a buffer of its packed bytes. */
function destination(loading: Loading, name: string): Uint8Array {
  const t = loading.targets.get(name)!;
  if (loading.format && compactWeight(name, t.shape)) {
    let bytes = loading.packed.get(name);
    if (!bytes) {
      bytes = new Uint8Array(weightBytes(name, t.shape, loading.format));
      loading.packed.set(name, bytes);
    }
    return bytes;
  }
  return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** Writes a chunk's bytes into its place in a weight. */
function fill(place: ChunkPlace, bytes: Uint8Array): void {
  place.into.set(bytes, place.offset);
}

function checkUpstream(jobId: string, assignment: StageAssignment[], upstream: string | undefined): void {
  if (upstream !== undefined && !assignment.some((s) => s.peerId === upstream)) {
    throw new UnauthorizedError(`upstream ${upstream} is not a worker of job ${jobId}'s assignment`);
  }
}
