import { InvalidMessageError } from '../../errors.ts';
import { parseAudit } from '../../p2p/index.ts';
import { weightsWithAdapter } from '../../models/index.ts';
import { packedToBytes, type Tensor, type WeightFormat } from '../../tensor/index.ts';
import type { KeptComputation, TrainingRecords } from '../records.ts';
import type { WorkRecord } from '../../verify/index.ts';
import type { JobEntry } from '../jobs.ts';
import { control, sectionOf, type StageHandler, trainingOf } from './types.ts';

/** A piece of a bundle as the index lists it, and its tensor. */
type Piece = { entry: PartEntry; tensor: Tensor };

/** One piece of what re-running a kept record needs. */
interface PartEntry {
  part: string;
  name?: string;
  /** The tensor's shape (a compact weight's as a matrix: its bytes go as a 'uint8' vector). */
  shape: number[];
  step?: number;
  /** A compact weight's format: it is sent as its packed bytes (packedToBytes), not as float32. */
  format?: WeightFormat;
}

/** A piece's index entry: a compact weight says its format. */
function entryOf(part: string, tensor: Tensor, name?: string, step?: number): PartEntry {
  return {
    part, ...(name ? { name } : {}), shape: [...tensor.shape], ...(step === undefined ? {} : { step }),
    ...(tensor.packed ? { format: tensor.packed.format } : {}),
  };
}

function keptOf(records: TrainingRecords, kind: 'forward' | 'backward' | 'step', step: number, micro: number): KeptComputation {
  return records.find(kind, step, micro);
}

/** Every piece of a record's bundle, by part and name. */
function pieces(records: TrainingRecords, kept: KeptComputation): Map<string, { entry: PartEntry; tensor: Tensor }> {
  const out = new Map<string, { entry: PartEntry; tensor: Tensor }>();
  const add = (part: string, tensor: Tensor | undefined, name?: string, step?: number) => {
    if (!tensor) return;
    out.set(`${part}:${name ?? ''}`, { entry: entryOf(part, tensor, name, step), tensor });
  };
  const { record } = kept;
  if (record.kind === 'step') {
    const snap = records.snapshot;
    if (!snap || snap.step !== record.step) throw new InvalidMessageError(`the state step ${record.step} started from is no longer kept`);
    for (const [n, t] of snap.weights) add('weight', t, n);
    for (const [n, t] of records.frozen) add('weight', t, n);
    for (const [n, t] of snap.grads) add('grads', t, n);
    for (const [n, m] of snap.moments) add('moments', m.moments, n, m.step);
    return out;
  }
  for (const [n, t] of records.weightsAt(record.step)) add('weight', t, n);
  for (const [n, t] of records.frozen) add('weight', t, n);
  add('input', kept.input);
  add('grad', kept.grad);
  add('output', kept.output);
  for (const [n, t] of kept.contribution ?? []) add('contribution', t, n);
  return out;
}

/**
 * What re-running a decoding step needs: the section's weights and every input of its
 * session up to that step (the validator rebuilds the KV cache from them).
 */
function decodeBundle(
  job: JobEntry, sessionId: string, step: number, withWeights = true, from = 0,
): { record: WorkRecord; parts: Map<string, Piece> } {
  const section = sectionOf(job);
  const session = section.sessions.get(sessionId);
  if (!session) throw new InvalidMessageError(`session ${sessionId} is no longer kept`);
  const upTo = session.history.findIndex((h) => h.record.step === step);
  if (upTo < 0) throw new InvalidMessageError(`session ${sessionId} has no decoding step at position ${step}`);
  const parts = new Map<string, { entry: PartEntry; tensor: Tensor }>();
  const add = (part: string, tensor: Tensor, name: string) => parts.set(`${part}:${name}`, { entry: entryOf(part, tensor, name), tensor });
  if (withWeights) for (const [n, t] of section.announced ?? weightsWithAdapter(section.model)) add('weight', t, n);
  if (from > upTo) throw new InvalidMessageError(`session ${sessionId}: steps from ${from} asked, its step at position ${step} is its ${upTo}th`);
  // the steps are named by their index in the session
  session.history.slice(from, upTo + 1).forEach((h, i) => {
    add('input', h.input, String(from + i));
    add('positions', h.positions, String(from + i));
    if (h.keyMask) add('mask', h.keyMask, String(from + i));
  });
  const output = session.history[upTo].output;
  if (output) add('output', output, '');
  return { record: session.history[upTo].record, parts };
}

/**
 * Audits of kept records, by the job's owner or a verifier it named (a validator): the
 * index lists what re-running a record needs; each part is then fetched as a tensor (a
 * compact weight as its packed bytes, a 'uint8' vector). What is sent is what the worker
 * holds: the verifier checks it against the signed record.
 */
export const auditHandlers: Record<string, StageHandler> = {
  'audit-index': {
    verifiers: true,
    run: ({ body, job }) => {
      const { kind, step, micro, session, weights, from } = parseAudit(body, false);
      if (kind === 'decode') {
        const { record, parts } = decodeBundle(job, session!, step, weights !== false, from);
        return control('audit', { record, parts: [...parts.values()].map((p) => p.entry) });
      }
      const { records } = trainingOf(job);
      const kept = keptOf(records, kind, step, micro);
      return control('audit', { record: kept.record, parts: [...pieces(records, kept).values()].map((p) => p.entry) });
    },
  },
  'audit-part': {
    verifiers: true,
    run: ({ body, job }) => {
      const { kind, step, micro, part, name, session, weights, from } = parseAudit(body, true);
      const all = kind === 'decode'
        ? decodeBundle(job, session!, step, weights !== false, from).parts
        : pieces(trainingOf(job).records, keptOf(trainingOf(job).records, kind, step, micro));
      const piece = all.get(`${part}:${name ?? ''}`);
      if (!piece) throw new InvalidMessageError(`the record of ${kind} ${step}:${micro} has no part ${part}${name ? ` '${name}'` : ''}`);
      const packed = piece.tensor.packed;
      if (packed) {
        // frozen (a compact section does not train): its bytes as they are held
        const bytes = packedToBytes(packed);
        return { kind: 'tensor', tensor: piece.tensor, part: { dtype: 'uint8', shape: [bytes.byteLength], bytes } };
      }
      // a copy: live weights change at the next step, perhaps while this answer is still being sent
      return { kind: 'tensor', tensor: piece.tensor.detach().clone() };
    },
  },
};
