import { InvalidArgumentError, InvalidMessageError, UnauthorizedError } from '../../errors.ts';
import { configFromHF, createModel } from '../../models/index.ts';
import { CHUNK_BYTES, expectTensors, parseAssign, parseChunk, parseLoad, type StageAssignment, type WeightEntry } from '../../p2p/index.ts';
import type { ChunkStore } from '../chunk-store.ts';
import type { JobTable } from '../jobs.ts';
import { control, NONE, type StageHandler } from './types.ts';

/**
 * Loading a section: the manifest (`load`), the chunks the worker lacked (`chunk`), and the
 * build (`assemble`). Only the job's owner loads; the job ends with the stream it loaded over.
 */
export const loadHandlers: Record<string, StageHandler> = {
  load: {
    run: ({ body, job, bindToStream }, { store, memoryBytes }) => {
      const request = parseLoad(body);
      const model = createModel(configFromHF(request.config), { section: request.section });
      const own = model.hfStateDict();
      let bytes = 0;
      for (const t of own.values()) bytes += t.size * 4;
      if (bytes > memoryBytes) throw new InvalidArgumentError(`the section needs ${bytes} bytes, this worker offers ${memoryBytes}`);
      if (request.weights.length !== own.size) throw new InvalidMessageError(`the manifest must list the section's ${own.size} weights`);
      for (const e of request.weights) {
        const t = own.get(e.name);
        if (!t) throw new InvalidMessageError(`'${e.name}' is not a weight of this section`);
        if (t.shape.length !== e.shape.length || t.shape.some((d, i) => d !== e.shape[i])) {
          throw new InvalidMessageError(`'${e.name}' has shape [${t.shape}] in this section, the manifest says [${e.shape}]`);
        }
        const chunks = Math.max(1, Math.ceil((4 * t.size) / CHUNK_BYTES));
        if (e.chunks.length !== chunks) throw new InvalidMessageError(`'${e.name}' is ${chunks} chunks of ${CHUNK_BYTES} bytes, the manifest lists ${e.chunks.length}`);
      }
      checkUpstream(job.jobId, request.assignment, request.upstream);
      job.assignment = request.assignment;
      job.loading = { model, entries: request.weights, upstream: request.upstream };
      bindToStream();
      return control('need', { chunks: store.missing(request.weights) });
    },
  },
  chunk: {
    maxTensors: 1,
    run: ({ body, tensors, job }, { store }) => {
      const { sha } = parseChunk(body);
      const [bytes] = expectTensors('chunk', tensors, 1);
      if (!job.loading) throw new InvalidMessageError(`job ${job.jobId} is not loading a section`);
      // only chunks the manifest lists, of the size their place in the weight gives, are taken: a peer cannot fill the store
      const entry = job.loading.entries.find((e) => e.chunks.includes(sha));
      if (!entry) throw new InvalidMessageError('a chunk the manifest does not list');
      const size = 4 * entry.shape.reduce((a, b) => a * b, 1);
      const expected = Math.min(CHUNK_BYTES, size - entry.chunks.indexOf(sha) * CHUNK_BYTES);
      if (bytes.bytes.length !== expected) throw new InvalidMessageError(`a chunk of '${entry.name}' must hold ${expected} bytes, not ${bytes.bytes.length}`);
      store.put(sha, bytes.bytes);
      return NONE;
    },
  },
  assemble: {
    run: ({ job }, { store, jobs }) => {
      const loading = job.loading;
      if (!loading) throw new InvalidMessageError(`job ${job.jobId} is not loading a section`);
      const missing = store.missing(loading.entries);
      if (missing.length > 0) throw new InvalidMessageError(`${missing.length} chunks of the section have not arrived (the first: ${missing[0].slice(0, 12)}…)`);
      loading.model.loadStateDict(new Map(loading.entries.map((e) => [e.name, store.assemble(e)])));
      job.loading = undefined;
      releaseChunks(store, jobs, loading.entries);
      job.section = { model: loading.model, sessions: new Map() };
      // the previous stage of a chain may pass activations on for this job
      job.upstream = loading.upstream;
      return control('loaded', { params: loading.model.numParameters() });
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

/** Drops the in-memory copies of a load's chunks, but those another load still waits for (two jobs may share weights). */
export function releaseChunks(store: ChunkStore, jobs: JobTable, entries: readonly WeightEntry[]): void {
  const wanted = new Set([...jobs.values()].flatMap((j) => j.loading?.entries.flatMap((e) => e.chunks) ?? []));
  store.release(entries.flatMap((e) => e.chunks).filter((sha) => !wanted.has(sha)));
}

function checkUpstream(jobId: string, assignment: StageAssignment[], upstream: string | undefined): void {
  if (upstream !== undefined && !assignment.some((s) => s.peerId === upstream)) {
    throw new UnauthorizedError(`upstream ${upstream} is not a worker of job ${jobId}'s assignment`);
  }
}
