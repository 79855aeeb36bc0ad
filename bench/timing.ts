export interface TimingOptions {
  warmup?: number;
  minRuns?: number;
  budgetMs?: number;
}

/** Median wall time of `fn` in milliseconds, after warm-up, within a time budget. */
export function timeSync(fn: () => void, options: TimingOptions = {}): number {
  const { warmup = 2, minRuns = 3, budgetMs = 1500 } = options;
  for (let i = 0; i < warmup; i++) fn();
  const times: number[] = [];
  const start = performance.now();
  while (times.length < minRuns || (performance.now() - start < budgetMs && times.length < 1000)) {
    const t0 = performance.now();
    fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

function median(times: number[]): number {
  const sorted = [...times].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

/**
 * Median times of two contenders measured in alternation, so that a passing load on
 * this machine (2 shared cores) affects both alike. Either may be async.
 */
export async function timePair(
  a: () => unknown,
  b: () => unknown,
  options: TimingOptions = {},
): Promise<[number, number]> {
  const { warmup = 2, minRuns = 5, budgetMs = 3000 } = options;
  for (let i = 0; i < warmup; i++) {
    await a();
    await b();
  }
  const ta: number[] = [];
  const tb: number[] = [];
  const start = performance.now();
  while (ta.length < minRuns || (performance.now() - start < budgetMs && ta.length < 1000)) {
    let t0 = performance.now();
    await a();
    ta.push(performance.now() - t0);
    t0 = performance.now();
    await b();
    tb.push(performance.now() - t0);
  }
  return [median(ta), median(tb)];
}

/**
 * Best-of-rounds median times of two contenders measured in blocks (all runs of one,
 * then all of the other, `rounds` times). Blocks keep one contender's idle native thread
 * pool from competing with the other's on a 2-core machine; best-of-rounds filters out
 * passing load from neighbours.
 */
export async function timeBlocks(
  a: () => unknown,
  b: () => unknown,
  options: TimingOptions & { rounds?: number } = {},
): Promise<[number, number]> {
  const { rounds = 3, warmup = 2, minRuns = 5, budgetMs = 600 } = options;
  const block = async (fn: () => unknown) => {
    for (let i = 0; i < warmup; i++) await fn();
    const times: number[] = [];
    const start = performance.now();
    while (times.length < minRuns || (performance.now() - start < budgetMs && times.length < 1000)) {
      const t0 = performance.now();
      await fn();
      times.push(performance.now() - t0);
    }
    return median(times);
  };
  let bestA = Number.POSITIVE_INFINITY;
  let bestB = Number.POSITIVE_INFINITY;
  for (let r = 0; r < rounds; r++) {
    bestA = Math.min(bestA, await block(a));
    bestB = Math.min(bestB, await block(b));
  }
  return [bestA, bestB];
}
