/** The simulation's seeded randomness: one stream per purpose, so that a change in one draws nothing else anew. */
export class Random {
  private state: number;

  constructor(seed: number) {
    // mulberry32's state, mixed from the seed
    this.state = (seed ^ 0x9e3779b9) >>> 0;
  }

  /** A uniform number in [0, 1). */
  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** A Weibull variate of shape `k` with the given median. */
  weibull(k: number, median: number): number {
    const scale = median / Math.log(2) ** (1 / k);
    return scale * (-Math.log(1 - this.next())) ** (1 / k);
  }

  /** An exponential variate with the given mean. */
  exponential(mean: number): number {
    return -mean * Math.log(1 - this.next());
  }

  /** One of `items`, drawn by their weights. */
  pick<T extends { weight: number }>(items: readonly T[]): T {
    const total = items.reduce((n, i) => n + i.weight, 0);
    let u = this.next() * total;
    for (const i of items) if ((u -= i.weight) < 0) return i;
    return items[items.length - 1];
  }

  /** An integer in [0, n). */
  below(n: number): number {
    return Math.floor(this.next() * n);
  }
}
