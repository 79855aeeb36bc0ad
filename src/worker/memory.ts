import { MemoryBudgetError } from '../errors.ts';

/**
 * What a job holds on a worker, each counted against the worker's budget. `runtime` is what the compute backend keeps
 * beside the job's compact weights (onnxruntime's prepacked copies: src/worker/release.ts).
 */
export type MemoryUse = 'weights' | 'runtime' | 'gradients' | 'optimizer' | 'activations' | 'kv-cache' | 'snapshot';

export const MEMORY_USES: readonly MemoryUse[] = ['weights', 'runtime', 'gradients', 'optimizer', 'activations', 'kv-cache', 'snapshot'];

/** Bytes as a person reads them. */
export function mib(bytes: number): string {
  return bytes >= 1024 ** 3 ? `${(bytes / 1024 ** 3).toFixed(2)} GiB` : `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
}

/** One job's holdings, as `status` and `stats` show them. */
export type JobMemory = { jobId: string } & Record<MemoryUse, number>;

/**
 * A worker's memory budget (`--memory`): every byte a job holds is accounted here before it
 * is allocated (weights when a section loads, gradients and AdamW's moments when it trains,
 * activations kept for backward per micro-batch, KV caches per session). A request that would
 * take the worker past its budget is refused with MemoryBudgetError and nothing is allocated;
 * freeing a job returns all it held.
 */
export class MemoryBudget {
  private readonly jobs = new Map<string, Record<MemoryUse, number>>();

  constructor(readonly total: number) {}

  used(): number {
    let sum = 0;
    for (const held of this.jobs.values()) for (const use of MEMORY_USES) sum += held[use];
    return sum;
  }

  free(): number {
    return Math.max(0, this.total - this.used());
  }

  /** What a job holds for `use`. */
  held(jobId: string, use: MemoryUse): number {
    return this.jobs.get(jobId)?.[use] ?? 0;
  }

  /**
   * Sets what a job holds for `use` to `bytes`. Growing past the budget throws
   * MemoryBudgetError, naming `what` and the numbers, and changes nothing; shrinking always works.
   */
  hold(jobId: string, use: MemoryUse, bytes: number, what: string): void {
    this.holdAll(jobId, { [use]: bytes }, what);
  }

  /** Adds to (or, negative, takes from) what a job holds for `use`. */
  add(jobId: string, use: MemoryUse, bytes: number, what: string): void {
    this.hold(jobId, use, Math.max(0, this.held(jobId, use) + bytes), what);
  }

  /** What a job holds, by use (zeros for a job that holds nothing yet). */
  private holdings(jobId: string): Record<MemoryUse, number> {
    return this.jobs.get(jobId) ?? { 'weights': 0, 'runtime': 0, 'gradients': 0, 'optimizer': 0, 'activations': 0, 'kv-cache': 0, 'snapshot': 0 };
  }

  /**
   * Counts what a job already holds for `use` (`bytes` more or, negative, less), past the budget if it must: memory that
   * exists is counted, not refused (a paged KV cache's pages, charged as its pool holds them after a step was admitted).
   */
  count(jobId: string, use: MemoryUse, bytes: number): void {
    const held = this.holdings(jobId);
    held[use] = Math.max(0, held[use] + bytes);
    this.jobs.set(jobId, held);
  }

  /** Sets several holdings of a job at once: all of them, or (past the budget, or given a non-size) none. */
  holdAll(jobId: string, holdings: Partial<Record<MemoryUse, number>>, what: string): void {
    const held = this.holdings(jobId);
    let growth = 0;
    for (const [use, bytes] of Object.entries(holdings) as [MemoryUse, number][]) {
      if (!Number.isFinite(bytes) || bytes < 0) throw new MemoryBudgetError(`${what}: ${bytes} is not a size in bytes`);
      growth += bytes - held[use];
    }
    if (growth > 0 && growth > this.free()) {
      throw new MemoryBudgetError(
        `${what} needs ${mib(growth)} more; this worker has ${mib(this.free())} free of the ${mib(this.total)} it offers (--memory)`,
        { details: { needed: growth, free: this.free(), total: this.total } },
      );
    }
    Object.assign(held, holdings);
    this.jobs.set(jobId, held);
  }

  /** Frees all a job held. */
  release(jobId: string): void {
    this.jobs.delete(jobId);
  }

  report(): { total: number; used: number; free: number; jobs: JobMemory[] } {
    return {
      total: this.total,
      used: this.used(),
      free: this.free(),
      jobs: [...this.jobs].map(([jobId, held]) => ({ jobId, ...held })),
    };
  }
}
