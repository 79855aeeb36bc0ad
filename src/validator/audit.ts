import { createHash } from 'node:crypto';
import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import { fromWire, jobConfigHash, type PeerTarget, publicKeyOf, TRAIN_REQUEST_TIMEOUT_MS, type WireAdapter } from '../p2p/index.ts';
import { baseManifest, baseMismatch, type JobBase } from './base-check.ts';
import type { Tensor } from '../tensor/index.ts';
import { adapterState, type CausalLM, configFromHF } from '../models/index.ts';
import {
  type Bundle, checkCommitments, checkpointHash, compactWeightOf, factorsHash, formatOfWeights, maxBundleBytes, parseRecord, rebuildSection,
  recordId, reexecute, type Reputation, type SessionPrefill, signatureValid, type Verdict, type WorkRecord,
} from '../verify/index.ts';
import { SectionCache, SessionPrefills } from './sections.ts';
import { openStageStream } from './stage-stream.ts';

/**
 * A commitment check of a session (AuditRequest.commit): the section from the cache, or rebuilt from the weights the
 * worker handed over and checked against the hash its records name (then cached), and one prefill over the session.
 */
function checkSession(
  req: AuditRequest, bundle: Bundle, cached: CausalLM | undefined, sections: SectionCache, key: string, prior?: SessionPrefill,
): Verdict & { prefill?: SessionPrefill; section?: CausalLM } {
  const { record } = req;
  try {
    let section = cached;
    if (!section) {
      const built = rebuildSection(configFromHF(req.config), record.stage, bundle.weights, req.adapter);
      if (typeof built === 'string') return { ok: false, reason: built };
      if (checkpointHash(built) !== record.weights) return { ok: false, reason: 'the weights it handed over are not the weights its records name' };
      sections.set(key, (section = built));
    }
    const format = formatOfWeights(section.stateDict().values());
    const { checks, chunks } = req.commit!;
    const session = { last: record, checks, chunks, history: bundle.history!, sent: req.sent };
    return { ...checkCommitments(section, session, format, prior), section };
  } catch (err) {
    return { ok: false, inconclusive: true, reason: `the check could not run: ${(err as Error).message}` };
  }
}

/** Parts a worker may list for one record: a section's weights and moments, or a session's steps. */
const MAX_AUDIT_PARTS = 20_000;

/** What a user asks a validator to check: one record a worker signed for its job, and what the job is. */
export interface AuditRequest {
  jobId: string;
  worker: PeerTarget;
  /** The model's config (Hugging Face form): the user's, not the worker's word. */
  config: Record<string, unknown>;
  optimizer: { lr: number; weightDecay?: number };
  record: WorkRecord;
  /** For a decoding step: the hashes of the inputs its session was sent, in order, up to it. */
  sent?: string[];
  /** The job's LoRA adapter (rank, alpha, targets): the section is rebuilt with it. */
  adapter?: WireAdapter;
  /** For a job over a hosted model: that model, its frozen base (the base a worker hands over is checked against it). */
  base?: JobBase;
  /** For a job that does not train, given an adapter's factors: their hash on the record's section (factorsHash). */
  factors?: string;
  /**
   * Check activation commitments instead of re-running the record (a decoding step): the records of the session that
   * carry the sampled chunks (`checks`, signed by the worker) and the chunks to check; `record` is the session's last
   * step to recompute up to. The section is the validator's (cached by job and weights): only the inputs move. `keep`:
   * the session is checked as it goes; its prefill is kept for the next check, which fetches and prefills only the
   * steps after.
   */
  commit?: { checks: WorkRecord[]; chunks: number[]; keep?: boolean };
}

export interface AuditVerdict extends Verdict {
  peer: string;
  /**
   * The worker computed with factors other than the ones its user says it gave (AuditRequest.factors): the user's word
   * against the worker's, so no score moves and nothing is slashed; the user leaves the worker.
   */
  unproven?: boolean;
  /** The worker failed to hand over what it signed (the record is no longer kept, or never was). */
  unavailable?: boolean;
}

/**
 * What an audit checks, named by content (a sha256): the record, what the user says about it (config, adapter, the
 * inputs sent) and, checking commitments, the chunks and the records that carry them. The same key is the same check:
 * a replayed request is answered from the first one and moves no reputation twice.
 */
export function auditKey(req: Pick<AuditRequest, 'record' | 'commit' | 'config' | 'adapter' | 'sent' | 'base' | 'factors'>): string {
  const h = createHash('sha256').update(recordId(req.record));
  h.update(`\n${jobConfigHash(req.config, req.adapter, req.base)}\n${req.base?.name ?? ''}\n${(req.sent ?? []).join(',')}\n${req.factors ?? ''}`);
  if (req.commit) h.update(`\n${req.commit.chunks.join(',')}\n${req.commit.checks.map(recordId).join(',')}`);
  return `audit:${h.digest('hex')}`;
}

/**
 * Re-runs one record: checks the user's copy is signed by the worker, fetches from the
 * worker what re-running it needs (its kept record must be the same record), re-executes it
 * and scores the worker by the outcome. Only the validator's own re-execution moves a
 * worker's reputation: a user cannot frame a worker, whose signed record and kept inputs
 * are the evidence.
 */
export async function audit(
  node: Libp2p, reputation: Reputation, req: AuditRequest, sections = new SectionCache(), sessions = new SessionPrefills(),
): Promise<AuditVerdict> {
  const { record, worker } = req;
  // a session checked as it goes: one check at a time, each going on from the last one's prefill
  if (req.commit?.keep) {
    const key = `${worker.peerId}/${req.jobId}/${record.session}/${record.weights}`;
    return sessions.serial(key, () => auditOnce(node, reputation, req, sections, { sessions, key }));
  }
  return auditOnce(node, reputation, req, sections);
}

async function auditOnce(
  node: Libp2p, reputation: Reputation, req: AuditRequest, sections: SectionCache, going?: { sessions: SessionPrefills; key: string },
): Promise<AuditVerdict> {
  const { record, worker } = req;
  const prior = going?.sessions.get(going.key);
  for (const r of [record, ...(req.commit?.checks ?? [])]) {
    if (r.peer !== worker.peerId || !signatureValid(r, publicKeyOf(worker.peerId))) {
      throw new InvalidMessageError(`the record to audit is not signed by ${worker.peerId}`);
    }
  }
  if (req.commit && record.kind !== 'decode') throw new InvalidArgumentError('commitments are checked for decoding steps only');
  // the validator's own copy of the section (fetched once per job and weights): a commitment check then moves no weights
  const sectionKey = `${req.jobId}:${record.weights}:${record.config ?? ''}`;
  const cached = req.commit ? sections.get(sectionKey) : undefined;
  // what the user says about the job must be what the worker signed: a user cannot frame a worker with another config
  if (record.job !== req.jobId) throw new InvalidArgumentError(`the record is of job ${record.job}, not ${req.jobId}`);
  if (record.config !== undefined && jobConfigHash(req.config, req.adapter, req.base) !== record.config) {
    throw new InvalidArgumentError('the config (and adapter) sent with the audit is not the one the worker was given');
  }
  // only a re-execution that ran moves the worker's score: a worker out of reach, a record it no longer keeps
  // (which an honest user never asks for) or a re-execution that could not run is no evidence either way
  const finish = (v: Verdict, unavailable = false): AuditVerdict => {
    if (!unavailable && !v.inconclusive) {
      reputation.check(worker.peerId, v.ok, v.ok ? undefined : `${record.kind} ${record.step}:${record.micro}: ${v.reason}`, auditKey(req));
    }
    return { ...v, peer: worker.peerId, ...(unavailable ? { unavailable } : {}) };
  };
  let client;
  try {
    client = await openStageStream(node, worker, { what: 'audit', fields: { jobId: req.jobId }, timeoutMs: TRAIN_REQUEST_TIMEOUT_MS });
  } catch (err) {
    return finish({ ok: false, reason: `the worker could not be reached: ${(err as Error).message}` }, true);
  }
  const limit = maxBundleBytes(req.config, record.stage);
  let bytes = 0;
  try {
    const which = {
      kind: record.kind, step: record.step, micro: record.micro, ...(record.session ? { session: record.session } : {}),
      ...(cached ? { weights: false } : {}), ...(prior && cached ? { from: prior.steps } : {}),
    };
    const first = prior && cached ? prior.steps : 0;
    let index: Record<string, unknown>;
    try {
      const frame = await client.call({ type: 'audit-index', ...which });
      if (frame.kind !== 'control') throw new InvalidMessageError('audit-index: expected a control answer');
      index = frame.message as Record<string, unknown>;
    } catch (err) {
      return finish({ ok: false, reason: `it did not hand over what re-running its record needs: ${(err as Error).message}` }, true);
    }
    const kept = parseRecord(index.record);
    if (recordId(kept) !== recordId(record)) {
      // a speculative pass its user had it cut: the re-signed record replaces it (a step is cut once), and the pass is
      // not its worker's to answer for; a worker that claims so falsely is out of its job all the same (unavailable)
      const same = kept.peer === record.peer && kept.session === record.session && kept.step === record.step;
      const cut = same && kept.cut === recordId(record);
      if (cut) return finish({ ok: false, reason: 'its worker cut this speculative pass to its accepted positions: the record that replaced it is the one to check' }, true);
      return finish({ ok: false, reason: 'the record it kept is not the record it returned' });
    }
    if (!Array.isArray(index.parts) || index.parts.length > MAX_AUDIT_PARTS) {
      return finish({ ok: false, reason: `it listed more than ${MAX_AUDIT_PARTS} parts to fetch` }, true);
    }
    const bundle: Bundle = {
      config: req.config, range: record.stage, optimizer: req.optimizer, weights: new Map(),
      ...(req.adapter ? { adapter: req.adapter } : {}),
    };
    if (req.sent) bundle.sent = req.sent;
    const history: { input?: Tensor; positions?: Tensor; keyMask: Tensor | null }[] = [];
    const at = (name: string) => {
      const i = Number(name) - first;
      if (!Number.isSafeInteger(i) || i < 0 || i > 1_000_000) throw new InvalidMessageError(`audit: '${name}' is not a step of a session asked for`);
      history[i] ??= { keyMask: null };
      return history[i];
    };
    const parts = index.parts as { part?: unknown; name?: unknown; step?: unknown; shape?: unknown; format?: unknown }[];
    // every part requested at once on the one stream: answers come back in order, without a round trip each
    const frames = await Promise.all(parts.map((p) =>
      client.call({ type: 'audit-part', ...which, part: p.part, ...(typeof p.name === 'string' ? { name: p.name } : {}) }).catch((err: unknown) => err as Error)));
    for (const [k, p] of parts.entries()) {
      const frame = frames[k];
      if (frame instanceof Error) return finish({ ok: false, reason: `it did not hand over part ${String(p.part)}: ${frame.message}` }, true);
      if (frame.kind !== 'tensor') return finish({ ok: false, reason: 'it answered a part with something else than a tensor' }, true);
      bytes += frame.tensor.bytes.byteLength;
      if (bytes > limit) return finish({ ok: false, reason: `its bundle passed ${limit} bytes, more than a section of layers [${record.stage}) needs` }, true);
      const name = typeof p.name === 'string' ? p.name : '';
      // a compact weight (only a weight may be one) travels as its packed bytes
      const compact = p.part === 'weight' && p.format !== undefined ? compactWeightOf(p.format, p.shape, frame.tensor.dtype, frame.tensor.bytes) : null;
      if (typeof compact === 'string') return finish({ ok: false, reason: `${compact} ('${name}')` }, true);
      const t: Tensor = compact ?? fromWire(frame.tensor);
      if (p.part === 'weight') bundle.weights.set(name, t);
      else if (record.kind === 'decode' && p.part === 'input') at(name).input = t;
      else if (p.part === 'positions') at(name).positions = t;
      else if (p.part === 'mask') at(name).keyMask = t;
      else if (p.part === 'input') bundle.input = t;
      else if (p.part === 'grad') bundle.grad = t;
      else if (p.part === 'output') bundle.output = t;
      else if (p.part === 'grads') (bundle.grads ??= new Map()).set(name, t);
      else if (p.part === 'contribution') (bundle.contribution ??= new Map()).set(name, t);
      else if (p.part === 'moments') (bundle.moments ??= new Map()).set(name, { moments: t, step: typeof p.step === 'number' ? p.step : 0 });
    }
    if (record.kind === 'step') {
      bundle.grads ??= new Map();
      bundle.moments ??= new Map();
    }
    // a job over a hosted model: the frozen base handed over must be that model's, whatever hash the worker signed
    if (req.base && bundle.weights.size > 0) {
      let manifest;
      try {
        manifest = await baseManifest(node, worker, req.base);
      } catch (err) {
        // it handed over its bundle and signed the base: a host of that model that will not show what the model is fails
        return finish({ ok: false, reason: `it did not hand over the manifest of model ${req.base.name}, its base: ${(err as Error).message}` });
      }
      const mismatch = baseMismatch(manifest, req.base, req.config, record.stage, bundle.weights);
      if (mismatch) return finish({ ok: false, reason: mismatch });
    }
    if (record.kind === 'decode') {
      if (history.some((h) => !h || !h.input || !h.positions)) return finish({ ok: false, reason: 'it handed over an incomplete session' });
      bundle.history = history.map((h) => ({ input: h.input!, positions: h.positions!, keyMask: h.keyMask }));
    }
    // a job that does not train, given an adapter's factors: once the record is what those it computed with give (any
    // other failure is evidence), they must be the ones its user gave; a host that kept older factors, or took others,
    // computes with them and signs their hash all the same. The user's word against the host's: unproven, unscored
    const given = (v: Verdict, factors: () => string): AuditVerdict => (v.ok && req.factors && factors() !== req.factors
      ? { ok: false, unproven: true, reason: 'it computes with LoRA factors other than the ones its user says it gave', peer: worker.peerId }
      : finish(v));
    if (req.commit) {
      const v = checkSession(req, bundle, cached, sections, sectionKey, first > 0 ? prior : undefined);
      if (going && v.ok && v.prefill) going.sessions.set(going.key, v.prefill);
      else going?.sessions.delete(going.key);
      delete v.prefill;
      const used = v.section;
      delete v.section;
      // the factors of the section checked, rebuilt from what it handed over or from the cache
      return given(v, () => factorsHash(adapterState(used ?? cached!)));
    }
    return given(reexecute(record, bundle), () => factorsHash(bundle.weights));
  } catch (err) {
    return finish({ ok: false, reason: `its bundle could not be read: ${(err as Error).message}` }, true);
  } finally {
    await client.close();
  }
}
