import { InvalidArgumentError, TimeoutError } from '../errors.ts';
import { type Tensor, tensor } from '../tensor/index.ts';
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
}

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
  private readonly inbox = new Map<string, Map<number, Tensor[]>>();
  private readonly wake = new Map<string, () => void>();

  /** Forgets every reduction under way (a step that failed is reset). */
  clear(): void {
    this.inbox.clear();
    this.wake.clear();
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
  deliver(key: string, index: number, grads: Tensor[]): void {
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
    send: (peer: string, grads: Tensor[]) => Promise<void>,
    timeoutMs = REDUCE_TIMEOUT_MS,
  ): Promise<void> {
    const mine = executor.grads(group.names);
    const others = group.peers.length - 1;
    try {
      await Promise.all(group.peers.map((peer, i) => (i === group.index ? undefined : send(peer, mine))));
      await this.arrival(group.key, others, timeoutMs);
    } catch (err) {
      this.inbox.delete(group.key); // a failed reduction holds no slot: the step is retried under a new key
      throw err;
    }
    const got = this.inbox.get(group.key) ?? new Map<number, Tensor[]>();
    this.inbox.delete(group.key);
    got.set(group.index, mine);
    const sums = group.names.map((name, j) => {
      const first = got.get(0)?.[j];
      if (!first) throw new InvalidArgumentError(`no gradient of '${name}' from holder 0 of ${group.key}`);
      const acc = new Float32Array(first.data);
      for (let i = 1; i < group.peers.length; i++) {
        const g = got.get(i)?.[j];
        if (!g || g.size !== acc.length) throw new InvalidArgumentError(`holder ${i} sent a gradient of '${name}' of the wrong size`);
        const d = g.data;
        for (let e = 0; e < acc.length; e++) acc[e] += d[e];
      }
      return tensor(acc, first.shape);
    });
    executor.setGrads(group.names, sums);
  }
}
