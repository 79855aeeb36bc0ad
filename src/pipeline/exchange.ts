import { InvalidArgumentError, TimeoutError } from '../errors.ts';
import { type Tensor, tensor, zeros } from '../tensor/index.ts';
import type { StageExecutor } from './executor.ts';

/** Parameters that several stages hold (replicas of a stage, or a head tied to the embedding on another worker). */
export interface ReduceGroup {
  /** Unique per step and group, so that messages of different steps or groups never mix. */
  key: string;
  names: string[];
  /** Where every holder is reached, in the order their gradients are added. */
  peers: string[];
  /** This holder's position in `peers`. */
  index: number;
  /**
   * The micro-batches each holder ran (replicas, in `peers` order): the reduction then adds every micro-batch's
   * contribution in the batch's order, as one process accumulates them, so replicas step bit for bit as one process.
   * The holders must keep their contributions (StageExecutor's keepMicros). Absent: each holder's sum, in `peers` order.
   */
  micros?: number[][];
}

/**
 * How a holder's gradients travel to the other holders of its group when they are compressed
 * (DCT top-k with error feedback, src/compress): `encode` gives the bytes sent for one
 * parameter's gradient and what every holder decodes from them (this holder adds the same);
 * `decode` restores a dense gradient from another holder's bytes.
 */
export interface GradientCodec {
  encode(name: string, grad: Tensor): { bytes: Uint8Array; own: Tensor };
  decode(name: string, bytes: Uint8Array, shape: readonly number[]): Tensor;
  /** The step whose gradients were encoded went through (its error feedback stands). */
  commit?(): void;
  /** The step failed: what it encoded is forgotten, so its retry starts from the same error feedback. */
  rollback?(): void;
}

/** Gradients as they came from one holder: dense tensors, or a codec's bytes per parameter. */
export type GradientPayload = Tensor[] | Uint8Array[];

/** Reductions a stage may have waiting for its peers at once. */
const MAX_PENDING = 64;
export const REDUCE_TIMEOUT_MS = 60_000;

/**
 * The sum of a parameter group's gradients among its holders, with no coordinator: every
 * holder sends its gradients to the others, waits for theirs and adds all of them in the
 * order of `peers`, so every holder ends with bit-identical gradients (and, after the same
 * optimizer step, bit-identical weights). With gradients of one shared loss this is the
 * whole batch's gradient: w ← Σ_j α_ij w_j with α = 1 over the replicas' contributions.
 */
export class GradientExchange {
  private readonly inbox = new Map<string, Map<number, GradientPayload>>();
  private readonly wake = new Map<string, () => void>();
  /** Bytes of gradients this holder sent to others (dense float32, or the codec's). */
  sentBytes = 0;
  /** The weights local steps start from (`anchor`); null while every step reduces gradients. */
  private anchored: Map<string, Float32Array> | null = null;

  /** `codec`: gradients travel compressed (null: dense float32, summed exactly). */
  constructor(private readonly codec: GradientCodec | null = null) {}

  /** Forgets every reduction under way (a step that failed is reset), and what the codec encoded for it. */
  clear(): void {
    this.inbox.clear();
    this.wake.clear();
    this.codec?.rollback?.();
  }

  /** The step went through (its optimizer step was taken): the codec keeps what it left out for the next. */
  commit(): void {
    this.codec?.commit?.();
  }

  /** This holder's gradients as sent, and as every holder adds them. */
  private encode(names: readonly string[], grads: Tensor[]): { payload: GradientPayload; own: Tensor[] } {
    const codec = this.codec;
    if (!codec) return { payload: grads, own: grads };
    const encoded = names.map((n, i) => codec.encode(n, grads[i]));
    return { payload: encoded.map((e) => e.bytes), own: encoded.map((e) => e.own) };
  }

  /** Another holder's gradient of `name` (j-th of the group, of this holder's `shape`) as a dense tensor. */
  private dense(payload: GradientPayload, j: number, name: string, shape: readonly number[]): Tensor | undefined {
    const item = payload[j];
    if (item === undefined) return undefined;
    if (!(item instanceof Uint8Array)) return item;
    if (!this.codec) throw new InvalidArgumentError(`'${name}' arrived compressed, and this holder does not compress gradients`);
    return this.codec.decode(name, item, shape);
  }

  /** Waits until `count` other holders' gradients of `key` arrived. */
  private arrival(key: string, count: number, timeoutMs: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const check = () => {
        if ((this.inbox.get(key)?.size ?? 0) < count) return;
        clearTimeout(timer);
        this.wake.delete(key);
        resolve();
      };
      const timer = setTimeout(() => {
        this.wake.delete(key);
        reject(new TimeoutError(`gradients of ${key} did not arrive from every replica within ${timeoutMs} ms`));
      }, timeoutMs);
      this.wake.set(key, check);
      check();
    });
  }

  /** Gradients from holder `index` of group `key`. */
  deliver(key: string, index: number, grads: GradientPayload): void {
    let got = this.inbox.get(key);
    if (!got) {
      if (this.inbox.size >= MAX_PENDING) throw new InvalidArgumentError(`more than ${MAX_PENDING} reductions pending`);
      got = new Map();
      this.inbox.set(key, got);
    }
    if (!Number.isInteger(index) || index < 0 || got.has(index)) throw new InvalidArgumentError(`gradients from holder ${index} of ${key} already arrived`);
    got.set(index, grads);
    this.wake.get(key)?.();
  }

  /**
   * Sends this holder's gradients to every other holder (`send`), waits for theirs and
   * replaces its own gradients by the sum.
   */
  async reduce(
    executor: StageExecutor,
    group: ReduceGroup,
    send: (peer: string, grads: GradientPayload) => Promise<void>,
    timeoutMs = REDUCE_TIMEOUT_MS,
  ): Promise<void> {
    if (group.micros) executor.setGrads(group.names, await this.ordered(executor, group, group.micros, send, timeoutMs));
    else executor.setGrads(group.names, await this.sum(group, executor.grads(group.names), send, timeoutMs));
  }

  /**
   * The ordered reduction (`micros`): this holder sends each micro-batch's contribution (its micro-batches in order,
   * each parameter of the group in turn; zeros where a micro-batch reached none), waits for the others' and adds all
   * of them in the batch's order: the first micro-batch's as it is, then each next one, as one process accumulates.
   */
  private async ordered(
    executor: StageExecutor,
    group: ReduceGroup,
    micros: number[][],
    send: (peer: string, grads: GradientPayload) => Promise<void>,
    timeoutMs: number,
  ): Promise<Tensor[]> {
    if (this.codec) throw new InvalidArgumentError('an ordered reduction adds exact gradients: it does not go with compressed ones');
    const shapes = group.names.map((n) => executor.named.get(n)?.shape ?? []);
    const sizes = shapes.map((s) => s.reduce((a, b) => a * b, 1));
    const mine = micros[group.index];
    const own = mine.flatMap((k) => group.names.map((n, j) => executor.contributionOf(k, n) ?? zeros(shapes[j])));
    const got = await this.gather(group, own, send, timeoutMs);
    const where = new Map<number, { holder: number; at: number }>();
    micros.forEach((list, holder) => list.forEach((k, at) => where.set(k, { holder, at })));
    const order = [...where.keys()].sort((a, b) => a - b);
    return group.names.map((name, j) => {
      let acc: Float32Array | null = null;
      for (const k of order) {
        const { holder, at } = where.get(k)!;
        const t = (got.get(holder) as Tensor[] | undefined)?.[at * group.names.length + j];
        if (!t || t instanceof Uint8Array || t.size !== sizes[j]) {
          throw new InvalidArgumentError(`holder ${holder} sent no gradient of '${name}' for micro-batch ${k} of ${group.key}`);
        }
        if (!acc) acc = new Float32Array(t.data);
        else {
          const d = t.data;
          for (let e = 0; e < acc.length; e++) acc[e] += d[e];
        }
      }
      return tensor(acc ?? new Float32Array(sizes[j]), shapes[j]);
    });
  }

  /**
   * Takes the weights this holder will train from: where the next `average` measures its
   * change from. Every holder of a group sets it at the same weights (the job's start, or
   * the last average), so that they agree again after each average.
   */
  anchor(executor: StageExecutor): void {
    this.anchored = new Map([...executor.named].map(([n, p]) => [n, (p.data as Float32Array).slice()]));
  }

  /**
   * Local steps' average (DiLoCo, Templar's SparseLoCo): every holder sends how far its weights
   * moved from the anchor since the last average (through the codec: DCT top-k with error
   * feedback, or dense), waits for the others' and sets its weights to anchor + the mean of
   * all the changes as decoded, which becomes the new anchor. The changes are added in the
   * order of `peers`, so every holder ends with bit-identical weights. AdamW's moments stay
   * each holder's own. An average that fails leaves the weights, the anchor and the error
   * feedback as they were.
   */
  async average(
    executor: StageExecutor,
    group: ReduceGroup,
    send: (peer: string, grads: GradientPayload) => Promise<void>,
    timeoutMs = REDUCE_TIMEOUT_MS,
  ): Promise<void> {
    const anchored = this.anchored;
    if (!anchored) throw new InvalidArgumentError('local steps are averaged from an anchor this holder never took (train-setup without syncEvery)');
    const params = group.names.map((n) => {
      const p = executor.named.get(n);
      const a = anchored.get(n);
      if (!p || !a || a.length !== p.size) throw new InvalidArgumentError(`'${n}' is not a parameter of this stage`);
      return { p, a };
    });
    const changes = params.map(({ p, a }) => {
      const w = p.data as Float32Array;
      return tensor(w.map((v, i) => v - a[i]), p.shape);
    });
    let sums: Tensor[];
    try {
      sums = await this.sum(group, changes, send, timeoutMs);
    } catch (err) {
      this.clear(); // what it encoded is forgotten: a retry sends the same change and error feedback
      throw err;
    }
    const n = group.peers.length;
    params.forEach(({ p, a }, j) => {
      const s = sums[j].data;
      for (let i = 0; i < a.length; i++) a[i] = Math.fround(a[i] + s[i] / n);
      (p.data as Float32Array).set(a);
    });
    this.commit(); // applied at once: what it left out is the next average's error feedback
  }

  /**
   * Sends this holder's tensors to every other holder (`send`), waits for theirs and returns
   * the sum over all holders, added in the order of `peers` (the same on every holder).
   */
  private async sum(
    group: ReduceGroup,
    tensors: Tensor[],
    send: (peer: string, grads: GradientPayload) => Promise<void>,
    timeoutMs: number,
  ): Promise<Tensor[]> {
    const { payload, own } = this.encode(group.names, tensors);
    const got = await this.gather(group, payload, send, timeoutMs, own);
    const at = (i: number, j: number, name: string) => {
      const p = got.get(i);
      return p && this.dense(p, j, name, own[j].shape);
    };
    return group.names.map((name, j) => {
      const first = at(0, j, name);
      if (!first) throw new InvalidArgumentError(`no gradient of '${name}' from holder 0 of ${group.key}`);
      const acc = new Float32Array(first.data);
      for (let i = 1; i < group.peers.length; i++) {
        const g = at(i, j, name);
        if (!g || g.size !== acc.length) throw new InvalidArgumentError(`holder ${i} sent a gradient of '${name}' of the wrong size`);
        const d = g.data;
        for (let e = 0; e < acc.length; e++) acc[e] += d[e];
      }
      return tensor(acc, first.shape);
    });
  }

  /**
   * Sends `payload` to every other holder of the group, waits for theirs, and returns every holder's by its index
   * (this holder's own as `own`, what every holder adds of it; default the payload).
   */
  private async gather(
    group: ReduceGroup,
    payload: GradientPayload,
    send: (peer: string, grads: GradientPayload) => Promise<void>,
    timeoutMs: number,
    own: GradientPayload = payload,
  ): Promise<Map<number, GradientPayload>> {
    const others = group.peers.length - 1;
    const size = payload.reduce((sum: number, p: Tensor | Uint8Array) => sum + (p instanceof Uint8Array ? p.byteLength : 4 * p.size), 0);
    try {
      await Promise.all(group.peers.map((peer, i) => (i === group.index
        ? undefined
        : send(peer, payload).then(() => {
            this.sentBytes += size;
          }))));
      await this.arrival(group.key, others, timeoutMs);
    } catch (err) {
      this.inbox.delete(group.key); // a failed reduction holds no slot: the step is retried under a new key
      throw err;
    }
    const got = this.inbox.get(group.key) ?? new Map<number, GradientPayload>();
    this.inbox.delete(group.key);
    got.set(group.index, own);
    return got;
  }
}
