import { InvalidMessageError, TimeoutError } from '../errors.ts';
import { MAX_PASSES_WAITING, PASS_WAIT_MS } from '../p2p/index.ts';
import type { Tensor } from '../tensor/index.ts';

/** Where a passed tensor is filed: its sender and the key the owner chose. */
export function passKey(sender: string, key: string): string {
  return `${sender} ${key}`;
}

interface Waiting {
  resolve: (t: Tensor) => void;
  reject: (e: unknown) => void;
  timer: ReturnType<typeof setTimeout>;
}

/**
 * The tensors a training job's neighbours pass to this worker (activations forward, their
 * gradients backward), each under the key the job's owner chose, until the request that uses
 * it comes: whichever arrives first waits for the other. A key is used once; a reset drops
 * what a failed step left (its keys are never asked for again).
 */
export class PassInbox {
  private readonly arrived = new Map<string, Tensor>();
  private readonly waiting = new Map<string, Waiting>();

  /** A neighbour's tensor under `key`. */
  deliver(key: string, t: Tensor): void {
    const w = this.waiting.get(key);
    if (w) {
      this.waiting.delete(key);
      clearTimeout(w.timer);
      w.resolve(t);
      return;
    }
    if (this.arrived.has(key)) throw new InvalidMessageError(`a tensor was already passed under ${key}`);
    if (this.arrived.size >= MAX_PASSES_WAITING) throw new InvalidMessageError(`more than ${MAX_PASSES_WAITING} passed tensors are waiting for their requests`);
    this.arrived.set(key, t);
  }

  /** The tensor passed under `key`, now or when it comes. */
  take(key: string, timeoutMs = PASS_WAIT_MS): Promise<Tensor> {
    const t = this.arrived.get(key);
    if (t) {
      this.arrived.delete(key);
      return Promise.resolve(t);
    }
    if (this.waiting.has(key)) return Promise.reject(new InvalidMessageError(`a request already waits for ${key}`));
    if (this.waiting.size >= MAX_PASSES_WAITING) return Promise.reject(new InvalidMessageError(`more than ${MAX_PASSES_WAITING} requests wait for passed tensors`));
    return new Promise<Tensor>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(key);
        reject(new TimeoutError(`no neighbour passed the tensor ${key} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(key, { resolve, reject, timer });
    });
  }

  /** Drops every tensor waiting and fails every request waiting (a step that failed is reset). */
  clear(reason = 'the step was reset'): void {
    this.arrived.clear();
    for (const [key, w] of this.waiting) {
      clearTimeout(w.timer);
      w.reject(new InvalidMessageError(`${reason} while waiting for ${key}`));
    }
    this.waiting.clear();
  }
}
