import { PeerUnreachableError, type TensorLinkError } from '../errors.ts';

interface Waiter<T> {
  resolve: (value: T) => void;
  reject: (err: Error) => void;
  timer: ReturnType<typeof setTimeout>;
  unlisten: () => void;
}

/**
 * Requests waiting for their answers, matched by id: the one table behind the control
 * client, the user's stage streams and its result inbox. Each request has a deadline and
 * may be cancelled by an AbortSignal; a closed stream fails every request still waiting.
 * Ids are handed out here, so two requests never share one.
 */
export class RequestTable<T> {
  private nextId = 1;
  private readonly waiting = new Map<number, Waiter<T>>();

  /** `who` names the peer in timeout messages ("12D3Koo…", "the result inbox"). */
  constructor(private readonly who: string) {}

  /** A fresh id and the promise of its answer (rejected after `timeoutMs` or when `signal` aborts). */
  open(timeoutMs: number, signal?: AbortSignal): { id: number; answer: Promise<T> } {
    const id = this.nextId++;
    const answer = new Promise<T>((resolve, reject) => {
      const late = () => new PeerUnreachableError(`${this.who} did not answer within ${timeoutMs} ms`, { details: { peer: this.who, deadlineMs: timeoutMs } });
      const timer = setTimeout(() => this.reject(id, late()), timeoutMs);
      const onAbort = () => this.reject(id, new PeerUnreachableError(`the request to ${this.who} was cancelled`, { cause: signal?.reason }));
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.set(id, { resolve, reject, timer, unlisten: () => signal?.removeEventListener('abort', onAbort) });
      if (signal?.aborted) onAbort();
    });
    answer.catch(() => {}); // the caller awaits it later; a deadline passing before then must not count as unhandled
    return { id, answer };
  }

  /** A fresh id for a message that expects no answer (an error answer to it is then ignored). */
  unanswered(): number {
    return this.nextId++;
  }

  /** True while request `id` waits for its answer. */
  has(id: unknown): boolean {
    return typeof id === 'number' && this.waiting.has(id);
  }

  /** Answers request `id`; an answer nobody waits for (late, or made up by the peer) is ignored. */
  resolve(id: unknown, value: T): void {
    const w = this.take(id);
    w?.resolve(value);
  }

  /** Fails request `id` (an error answer, a send that failed). */
  reject(id: unknown, err: TensorLinkError | Error): void {
    const w = this.take(id);
    w?.reject(err);
  }

  /** Fails every waiting request (the stream closed). */
  rejectAll(err: Error): void {
    for (const id of [...this.waiting.keys()]) this.reject(id, err);
  }

  get size(): number {
    return this.waiting.size;
  }

  private take(id: unknown): Waiter<T> | undefined {
    if (typeof id !== 'number') return undefined;
    const w = this.waiting.get(id);
    if (!w) return undefined;
    this.waiting.delete(id);
    clearTimeout(w.timer);
    w.unlisten();
    return w;
  }
}
