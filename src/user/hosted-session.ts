import { randomUUID } from 'node:crypto';
import { InvalidArgumentError, PeerUnreachableError, PlanInfeasibleError, VerificationError } from '../errors.ts';
import { publicKeyOf } from '../p2p/index.ts';
import { auxHash, hashTensors, parseRecord, sessionStepHash, signatureValid, type WorkRecord } from '../verify/index.ts';
import { cutStep } from '../models/index.ts';
import type { Tensor } from '../tensor/index.ts';
import type { RemoteStage } from './remote-stage.ts';

/** One hop of a route over hosts: who serves which blocks (from 0, inclusive). */
export interface RouteHop {
  peerId: string;
  addrs: string[];
  layers: [number, number];
}

/** One step a span was sent: its input hidden states, positions and key mask (replayed on a host that takes it over). */
interface SentStep {
  x: Tensor;
  positions: Tensor;
  keyMask: Tensor | null;
  /** Its hash as an audit names it (sessionStepHash), once asked for. */
  hash?: string;
}

/**
 * A hop of a session's route: the host, its stage stream, and every step sent to it so far (a step let go, past the
 * session's MAX_KEPT_INPUT_BYTES, by its hash alone: what audits name it by).
 */
interface LiveHop {
  hop: RouteHop;
  stage: RemoteStage;
  sent: (SentStep | string)[];
  /** A cut of its last step (a speculative pass) that its next step asks for first. */
  cut?: PendingCut;
}

/** A step's hash as an audit names it (sessionStepHash), computed once. */
function stepHash(s: SentStep | string): string {
  if (typeof s === 'string') return s;
  return (s.hash ??= sessionStepHash(hashTensors([s.x]), auxHash(s.positions, s.keyMask)));
}

/** Bytes a kept step holds. */
function stepBytes(s: SentStep): number {
  return s.x.data.byteLength + s.positions.data.byteLength + (s.keyMask?.data.byteLength ?? 0);
}

/**
 * Inputs a session keeps to replay on a host that takes over from a lost one (each hop's every step: a decoding step is
 * one position's hidden states, a prompt all of its positions'). Past this, they are let go (their hashes kept, which
 * audits name them by) and a host lost after cannot be replaced: the session then fails with PeerUnreachableError.
 */
export const MAX_KEPT_INPUT_BYTES = 256 * 2 ** 20;

/** A pass cut to `length` positions: what the host's re-signed record must name, and the pass's own record's report. */
interface PendingCut {
  length: number;
  from: number;
  input: SentStep;
  output: Tensor;
  report: () => void;
}

/** What a session needs from its model: a stage stream to a host's span, and a fresh route over some blocks. */
export interface SessionRouter {
  stageFor(hop: RouteHop): Promise<RemoteStage>;
  /** A route over blocks [from, to) that avoids `avoid` (null: none now), from a fresh look at the index and the peers. */
  reroute(from: number, to: number, avoid: ReadonlySet<string>): Promise<RouteHop[] | null>;
  /**
   * Each step a host signed, as it came: the host, its record (signed by the host, of this step: the caller samples
   * and audits what it computed), and the
   * hashes of every step its session on that host was sent so far (what the validator checks its kept inputs against).
   */
  onRecord?(hop: RouteHop, record: WorkRecord, sent: () => string[], input: Tensor): void;
}

/** How many times one step may re-route before the session gives up (each try avoids every host that failed before). */
const MAX_REROUTES = 4;

/**
 * One session on a hosted model, driven step by step by its user: each step goes through the route's hosts in turn.
 * A host that fails (its stream closed, it died) is replaced: its blocks are routed again over other hosts, every
 * step it had been sent is replayed there to rebuild their KV caches, and the step goes on, so the session's tokens
 * are those it would have given without the failure (bit for bit on js). Only the broken span is replayed.
 */
export class HostedSession {
  readonly id = randomUUID();
  private readonly failed = new Set<string>();
  /** Host failures it recovered from: the host, its blocks, and the steps replayed. */
  readonly failovers: { peerId: string; layers: [number, number]; replayed: number }[] = [];

  /** Bytes of the inputs it keeps for replay (every hop's). */
  private kept = 0;
  /** Whether it still keeps every step it sent (false once past its limit: a lost host then ends it). */
  private replayable = true;

  private constructor(private readonly router: SessionRouter, private readonly maxKeptBytes: number) {}

  /** `maxKeptBytes`: the inputs it keeps to replay on another host (default MAX_KEPT_INPUT_BYTES). */
  static async open(router: SessionRouter, route: RouteHop[], maxKeptBytes = MAX_KEPT_INPUT_BYTES): Promise<HostedSession> {
    const session = new HostedSession(router, maxKeptBytes);
    session.hops = await session.connect(route);
    return session;
  }

  private hops: LiveHop[] = [];

  /**
   * Stage streams to a route's hosts; a host that cannot be reached is avoided and its blocks routed again (a host
   * that died since the index last heard of it).
   */
  private async connect(route: RouteHop[], tries = 0): Promise<LiveHop[]> {
    const out: LiveHop[] = [];
    for (const hop of route) {
      try {
        out.push({ hop, stage: await this.router.stageFor(hop), sent: [] });
      } catch (err) {
        if (!(err instanceof PeerUnreachableError) || tries >= MAX_REROUTES) throw err;
        this.failed.add(hop.peerId);
        const [first, last] = hop.layers;
        const around = await this.router.reroute(first, last + 1, this.failed);
        if (!around) throw new PlanInfeasibleError(`blocks ${first}-${last}: their host …${hop.peerId.slice(-8)} cannot be reached and no other online host covers them`);
        out.push(...await this.connect(around, tries + 1));
      }
    }
    return out;
  }

  /** What it keeps to replay on a host that takes over: bytes, and whether every step is still there. */
  get replay(): { keptBytes: number; complete: boolean } {
    return { keptBytes: this.kept, complete: this.replayable };
  }

  /** Keeps `step` for replay on hop `h`; past the session's limit, lets go of every step but each hop's last. */
  private keepSent(h: LiveHop, step: SentStep): void {
    const letGo = (hop: LiveHop, k: number) => {
      const s = hop.sent[k];
      if (k < 0 || typeof s === 'string') return;
      hop.sent[k] = stepHash(s);
      this.kept -= stepBytes(s);
    };
    h.sent.push(step);
    this.kept += stepBytes(step);
    if (!this.replayable) {
      letGo(h, h.sent.length - 2);
      return;
    }
    if (this.kept <= this.maxKeptBytes) return;
    this.replayable = false;
    for (const hop of this.hops.includes(h) ? this.hops : [...this.hops, h]) for (let k = 0; k < hop.sent.length - 1; k++) letGo(hop, k);
  }

  /** The hosts it runs on now, in order. */
  get route(): RouteHop[] {
    return this.hops.map((h) => h.hop);
  }

  /** A speculative pass's records, held until it is kept whole or cut (null: the last step was no pass). */
  private deferred: { peer: string; report: () => void }[] | null = null;
  /** The last step's output (the last block's): a pass cut short is checked against its first rows. */
  private lastOut: Tensor | null = null;

  /**
   * The session ends: the last pass's records go on to the router, and so do those of a pass whose cut no step asked
   * for (the hosts hold it uncut: its records are of what they computed).
   */
  settle(): void {
    this.settleDeferred();
    for (const h of this.hops) {
      h.cut?.report();
      h.cut = undefined;
    }
  }

  /** The last pass was kept whole (a step came after it): its records go on to the router. */
  private settleDeferred(): void {
    const pending = this.deferred ?? [];
    this.deferred = null;
    for (const p of pending) p.report();
  }

  /**
   * One step through every hop: the hidden states the last block gives. A speculative `pass` holds its records until
   * it is kept whole (settle) or cut (keep).
   */
  async step(x: Tensor, positions: Tensor, keyMask: Tensor | null, pass = false): Promise<Tensor> {
    this.settleDeferred();
    const deferred: { peer: string; report: () => void }[] | null = pass ? [] : null;
    for (let i = 0; i < this.hops.length; i++) {
      const step = { x, positions, keyMask };
      for (let tries = 0; ; tries++) {
        const hop = this.hops[i];
        const cut = hop.cut;
        try {
          const done = await hop.stage.forwardRecorded(this.id, step.x, positions, keyMask, undefined, cut?.length);
          if (cut) {
            hop.cut = undefined;
            this.takeCut(hop, cut, done.cut);
          }
          // the record must be of this step and its answer: a host that signs one thing and sends another is a cheat
          const record = recordOf(done.record, hop.hop.peerId);
          if (!record || record.input !== done.input || !('output' in done.expect) || record.output !== done.expect.output) {
            throw new VerificationError(`host …${hop.hop.peerId.slice(-8)} answered a step with a record that is not of it`);
          }
          x = done.output;
          this.keepSent(hop, step);
          // the steps up to this one, hashed when asked, each once (a check made later still names this step's past only);
          // this step as it was sent, even if a cut replaced it since (a pass whose cut never came is checked as computed)
          const sent = hop.sent;
          const upTo = sent.length;
          const hashes = () => [...sent.slice(0, upTo - 1).map(stepHash), stepHash(step)];
          const report = () => this.router.onRecord?.(hop.hop, record, hashes, step.x);
          if (deferred) deferred.push({ peer: hop.hop.peerId, report });
          else report();
          break;
        } catch (err) {
          if (!(err instanceof PeerUnreachableError) || tries >= MAX_REROUTES) {
            // the step failed (the session with it): whether the host had cut the pass first is not known, so neither the
            // pass's record nor a cut one goes to the checks (an honest host is never checked against what it no longer holds)
            hop.cut = undefined;
            throw err;
          }
          i = await this.replace(i);
          // the replacement hops start at index i: this step goes on from there with the same input
        }
      }
    }
    this.deferred = deferred;
    this.lastOut = x;
    return x;
  }

  /**
   * Keeps the first `length` positions of the session (a speculative pass's accepted ones): each host cuts its KV cache
   * and what it keeps, and signs the pass again for the positions kept, when the next step asks it (one trip for both);
   * the record is checked against the pass's inputs and outputs cut alike and goes to the router instead of the pass's.
   * A host lost meanwhile is replaced as in a step (the new hosts replay what was sent, already cut, and need no cut).
   */
  keep(length: number): Promise<void> {
    const pending = this.deferred;
    this.deferred = null;
    const last = this.hops[0]?.sent.at(-1) as SentStep | undefined;
    const steps = last?.x.shape[1] ?? 1;
    const from = (last?.positions.data[0] as number | undefined) ?? 0;
    if (!last || !pending || !this.lastOut || length <= from || length > from + steps) {
      throw new InvalidArgumentError(`a session cannot keep ${length} positions: only its last speculative pass can be cut`);
    }
    if (length === from + steps) {
      for (const p of pending) p.report();
      return Promise.resolve();
    }
    const keep = length - from;
    // what each hop was sent and gave, cut: the next hop's input is this one's output
    const inputs = this.hops.map((h): SentStep => {
      const { x, positions, keyMask } = cutStep(h.sent.at(-1) as SentStep, keep, ['x']);
      return { x, positions, keyMask };
    });
    const outputs = [...inputs.slice(1).map((s) => s.x), this.lastOut.narrow(1, 0, keep).contiguous()];
    const reports = [...pending];
    for (const [i, h] of this.hops.entries()) {
      this.kept += stepBytes(inputs[i]) - stepBytes(h.sent.at(-1) as SentStep);
      h.sent[h.sent.length - 1] = inputs[i];
      const own = reports.findIndex((p) => p.peer === h.hop.peerId);
      const report = own >= 0 ? reports.splice(own, 1)[0].report : () => {};
      h.cut = { length, from, input: inputs[i], output: outputs[i], report };
    }
    this.lastOut = outputs[outputs.length - 1];
    return Promise.resolve();
  }

  /** A host's re-signed record of its cut pass, checked against the pass cut alike, to the router. */
  private takeCut(hop: LiveHop, cut: PendingCut, came: unknown): void {
    const record = recordOf(came, hop.hop.peerId);
    const s = cut.input;
    if (!record || record.step !== cut.from || record.input !== hashTensors([s.x]) || record.output !== hashTensors([cut.output])
      || record.aux !== auxHash(s.positions, s.keyMask)) {
      cut.report();
      throw new VerificationError(`host …${hop.hop.peerId.slice(-8)} cut a pass with a record that is not of the positions kept`);
    }
    const sent = hop.sent;
    const upTo = sent.length;
    this.router.onRecord?.(hop.hop, record, () => sent.slice(0, upTo).map(stepHash), s.x);
  }

  /**
   * Replaces hop `i` (its host failed) by a route over its blocks on other hosts, replays the steps it had been sent
   * through them, and returns the index of the first new hop.
   */
  private async replace(i: number): Promise<number> {
    const broken = this.hops[i];
    this.failed.add(broken.hop.peerId);
    broken.stage.abort();
    const [first, last] = broken.hop.layers;
    if (broken.sent.some((s) => typeof s === 'string')) {
      throw new PeerUnreachableError(`blocks ${first}-${last} lost their host …${broken.hop.peerId.slice(-8)}, and the session let go of the inputs `
        + `it would replay on another (past ${Math.round(this.maxKeptBytes / 2 ** 20)} MiB kept): start it again`);
    }
    const route = await this.router.reroute(first, last + 1, this.failed);
    if (!route) throw new PlanInfeasibleError(`blocks ${first}-${last} lost their host …${broken.hop.peerId.slice(-8)} and no other online host covers them`);
    const fresh = await this.connect(route);
    // the KV caches of the new hosts are rebuilt from what the lost one had been sent, step by step
    for (const s of broken.sent as SentStep[]) {
      let y = s.x;
      for (const h of fresh) {
        h.sent.push({ x: y, positions: s.positions, keyMask: s.keyMask });
        this.kept += stepBytes(h.sent.at(-1) as SentStep);
        y = await h.stage.forward(this.id, y, s.positions, s.keyMask);
      }
    }
    for (const s of broken.sent as SentStep[]) this.kept -= stepBytes(s);
    this.failovers.push({ peerId: broken.hop.peerId, layers: broken.hop.layers, replayed: broken.sent.length });
    this.hops.splice(i, 1, ...fresh);
    return i;
  }

  /** Frees the session's KV caches on its hosts. */
  async close(): Promise<void> {
    await Promise.all(this.hops.map((h) => h.stage.closeSession(this.id).catch(() => {})));
  }
}

/** A host's record of a step: well formed and signed by that host; null otherwise. */
function recordOf(raw: unknown, host: string): WorkRecord | null {
  try {
    const record = parseRecord(raw);
    return record.peer === host && signatureValid(record, publicKeyOf(host)) ? record : null;
  } catch {
    return null;
  }
}
