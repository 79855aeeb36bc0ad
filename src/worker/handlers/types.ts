import type { PeerId } from '@libp2p/interface';
import { InvalidMessageError } from '../../errors.ts';
import type { HopPart } from '../../compress/index.ts';
import type { WireTensor, WorkCounters } from '../../p2p/index.ts';
import type { Tensor } from '../../tensor/index.ts';
import type { RecordSigner, WorkRecord } from '../../verify/index.ts';
import type { ChunkStore } from '../chunk-store.ts';
import type { FaultInjector } from '../fault.ts';
import type { JobEntry, JobTable, Section, Training } from '../jobs.ts';
import type { MemoryBudget } from '../memory.ts';
import type { ModelIndex } from '../model-index.ts';
import type { PeerStreams } from '../peer-streams.ts';

/** What every stage handler may use: the worker's jobs, its chunk store, its budget and its outgoing streams. */
export interface StageContext {
  jobs: JobTable;
  store: ChunkStore;
  /** The checkpoints the worker holds on disk (`--models`), by chunk address. */
  models: ModelIndex | null;
  /** Every byte its jobs hold, against what the worker offers (`--memory`). */
  memory: MemoryBudget;
  work: WorkCounters;
  peers: PeerStreams;
  /** How long a send may wait for a peer that takes no bytes. */
  stallMs: number;
  /** Signs the records of its computations (its libp2p identity). */
  signer: RecordSigner;
  /** A cheating worker's faults (`--fault`, for testing the network's defences); null when honest. */
  fault: FaultInjector | null;
}

/** One request of the stage protocol, parsed down to its envelope, with the job it was authorized for. */
export interface StageRequest {
  id: number;
  type: string;
  body: Record<string, unknown>;
  tensors: WireTensor[];
  job: JobEntry;
  from: PeerId;
  /** Ties the job's lifetime to the stream this request came on (a load): the job ends when the stream does. */
  bindToStream(): void;
}

/**
 * A tensor answer goes as its frame (`part`: a training result's hop, encoded once; a compact weight's bytes) or as
 * float32; `cut`: the re-signed record of the speculative pass the step cut first, beside the step's own.
 */
export type StageReply
  = | { kind: 'tensor'; tensor: Tensor; record?: WorkRecord; cut?: WorkRecord; part?: HopPart | Omit<WireTensor, 'requestId'> }
    | { kind: 'control'; message: Record<string, unknown> }
    | { kind: 'none' };

export interface StageHandler {
  /** Whether peers the owner delegated (the previous stage of a chain, a replica) may send it; otherwise the owner only. */
  delegates?: boolean;
  /** Whether the job's verifiers (validators the owner named at load) may send it; nobody else but the owner. */
  verifiers?: boolean;
  /** Tensor frames the request may carry (default 0); a header announcing more is refused before any arrives. */
  maxTensors?: number;
  run(request: StageRequest, context: StageContext): Promise<StageReply> | StageReply;
}

export const NONE: StageReply = { kind: 'none' };

export function control(type: string, fields: Record<string, unknown> = {}): StageReply {
  return { kind: 'control', message: { type, ...fields } };
}

/** The built section of a request's job (a typed error if none is loaded). */
export function sectionOf(job: JobEntry): Section {
  if (!job.section) throw new InvalidMessageError(`job ${job.jobId} has no section loaded`);
  return job.section;
}

/** The training state of a request's job (a typed error before train-setup). */
export function trainingOf(job: JobEntry): Training {
  const training = sectionOf(job).training;
  if (!training) throw new InvalidMessageError(`job ${job.jobId} is not set up for training on this worker`);
  return training;
}
