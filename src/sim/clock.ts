/**
 * Virtual time for the simulation: events in a binary heap, run in time order (ties in the order they were scheduled),
 * each at its own instant; nothing waits on the wall clock. Times are milliseconds since the simulation began.
 */
export class VirtualClock {
  private heap: { at: number; seq: number; run: () => void }[] = [];
  private seq = 0;
  private time = 0;
  /** Events run so far. */
  ran = 0;

  now(): number {
    return this.time;
  }

  /** Runs `fn` at virtual time `at` (now, if `at` has passed). */
  at(at: number, fn: () => void): void {
    this.push({ at: Math.max(at, this.time), seq: this.seq++, run: fn });
  }

  /** Runs `fn` after `ms` of virtual time. */
  after(ms: number, fn: () => void): void {
    this.at(this.time + ms, fn);
  }

  /** Runs every event due up to `until` (ms), in order; the clock ends at `until`. */
  run(until: number): void {
    while (this.heap.length > 0 && this.heap[0].at <= until) {
      const e = this.pop();
      this.time = e.at;
      this.ran++;
      e.run();
    }
    this.time = until;
  }

  private less(a: number, b: number): boolean {
    const x = this.heap[a];
    const y = this.heap[b];
    return x.at < y.at || (x.at === y.at && x.seq < y.seq);
  }

  private push(e: { at: number; seq: number; run: () => void }): void {
    const h = this.heap;
    h.push(e);
    for (let i = h.length - 1; i > 0;) {
      const parent = (i - 1) >> 1;
      if (!this.less(i, parent)) break;
      [h[i], h[parent]] = [h[parent], h[i]];
      i = parent;
    }
  }

  private pop(): { at: number; seq: number; run: () => void } {
    const h = this.heap;
    const top = h[0];
    const last = h.pop()!;
    if (h.length > 0) {
      h[0] = last;
      for (let i = 0; ;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && this.less(l, m)) m = l;
        if (r < h.length && this.less(r, m)) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m], h[i]];
        i = m;
      }
    }
    return top;
  }
}
