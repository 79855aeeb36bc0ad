/**
 * Where a host places its blocks (`worker --host-auto`), after Petals' block selection: every block's throughput is
 * the sum of its online hosts' throughputs; a host joins at the window of blocks whose throughputs are lowest among
 * those that start where a route reaches (our router uses a host's span whole, so a span must begin where another
 * ends, or at block 0: routableWindow), and moves only when the swarm's lowest block throughput would rise by at
 * least 1 / quality (0.75: a third), never leaving a block without a host. Pure logic: the worker feeds it the model
 * index.
 */

/** A host's span of blocks [start, end) and the throughput it adds to each of them. */
export interface PlacedSpan {
  peerId: string;
  start: number;
  end: number;
  throughput: number;
}

/** The share of its free memory a joining host gives its blocks (the rest for KV caches and the runtime). */
export const BLOCK_MEMORY_SHARE = 0.8;

/**
 * Blocks a host of `freeBytes` holds of a model of `blocks` blocks, each of `perBlockBytes`: as many as fit
 * BLOCK_MEMORY_SHARE of it (or `asked`), at least one and at most the model.
 */
export function spanLength(freeBytes: number, perBlockBytes: number, blocks: number, asked?: number): number {
  const fit = Math.floor((BLOCK_MEMORY_SHARE * freeBytes) / Math.max(1, perBlockBytes));
  return Math.max(1, Math.min(blocks, asked ?? fit));
}

/**
 * What a host adds to each block of its span: the tokens a second it pushes through the span, its speed (`gflops`)
 * over the FLOPs a token costs in all of the span's blocks. A host of one block adds to that block what a host as fast
 * with six blocks adds to each of its six, six times over (as Petals divides a server's speed by the blocks it serves).
 */
export function spanThroughput(gflops: number, spanFlopsPerToken: number): number {
  return (gflops * 1e9) / Math.max(1, spanFlopsPerToken);
}

/** Throughputs below this count as none (floating point left over from subtracting a span). */
const EPS = 1e-3;

/** Every block's throughput: the sum over the spans that hold it. */
export function blockThroughputs(spans: readonly PlacedSpan[], blocks: number): Float64Array {
  const t = new Float64Array(blocks);
  for (const s of spans) for (let b = Math.max(0, s.start); b < Math.min(blocks, s.end); b++) t[b] += s.throughput;
  return t;
}

/**
 * The start of the window of `length` blocks to take: the one whose throughputs, sorted ascending, are the least in
 * lexicographic order (its weakest block first, then its next weakest), the first such window on ties. `starts`: only
 * these starts (default: every one); 0 where none fits.
 */
export function bestStart(throughputs: ArrayLike<number>, length: number, starts?: readonly number[]): number {
  let best = 0;
  let bestKey: number[] | null = null;
  const candidates = starts ?? Array.from({ length: Math.max(0, throughputs.length - length + 1) }, (_, i) => i);
  for (const i of candidates) {
    if (i + length > throughputs.length) continue;
    const key = Array.from({ length }, (_, k) => throughputs[i + k]).sort((a, b) => a - b);
    if (bestKey === null || lessThan(key, bestKey)) {
      best = i;
      bestKey = key;
    }
  }
  return best;
}

/**
 * The block boundaries a route reaches from block 0 through these spans, each used whole (the router takes a host's
 * span as it is: user/hosted-routing.ts), ascending. A span that starts anywhere else cannot be on any route yet.
 */
export function reachableStarts(spans: readonly PlacedSpan[], blocks: number): number[] {
  const reached = new Set<number>([0]);
  const byStart = [...spans].sort((a, b) => a.start - b.start);
  for (const s of byStart) if (reached.has(s.start) && s.end <= blocks) reached.add(s.end);
  return [...reached].filter((b) => b < blocks).sort((a, b) => a - b);
}

/**
 * Where a joining host that can hold `length` blocks goes so that routes can use it: at a boundary a route reaches
 * (reachableStarts), taking at most the blocks from there to the model's end. Of those windows, the one whose
 * throughputs, sorted ascending, are least (as bestStart), the first on ties.
 */
export function routableWindow(
  throughputs: ArrayLike<number>, length: number, spans: readonly PlacedSpan[],
): { start: number; length: number } {
  const blocks = throughputs.length;
  let best = { start: 0, length: Math.min(length, blocks) };
  let bestKey: number[] | null = null;
  for (const start of reachableStarts(spans, blocks)) {
    const n = Math.min(length, blocks - start);
    const key = Array.from({ length: n }, (_, k) => throughputs[start + k]).sort((a, b) => a - b);
    if (bestKey === null || lessThan(key.slice(0, bestKey.length), bestKey.slice(0, key.length))) {
      best = { start, length: n };
      bestKey = key;
    }
  }
  return best;
}

function lessThan(a: number[], b: number[]): boolean {
  for (let i = 0; i < a.length; i++) {
    if (Math.abs(a[i] - b[i]) > 1e-9) return a[i] < b[i];
  }
  return false;
}

/**
 * Whether host `self` should move, and where: its span is taken out and put at its best start that a route reaches
 * through the others (reachableStarts); then every host in
 * turn (in `order`, shuffled by the caller) does the same until none moves, as the swarm would settle. It moves only
 * when the lowest block throughput after settling is at least 1 / quality times the lowest now, and no block is left
 * without throughput. Returns the new start, or null to stay.
 */
export function moveTo(
  self: string, spans: readonly PlacedSpan[], blocks: number, quality = 0.75, order?: readonly string[],
): number | null {
  const placed = spans.map((s) => ({ ...s }));
  const mine = placed.find((s) => s.peerId === self);
  if (!mine) return null;
  const t = blockThroughputs(placed, blocks);
  const initial = Math.min(...t);
  const take = (s: PlacedSpan, sign: number) => {
    for (let b = s.start; b < s.end; b++) t[b] += sign * s.throughput;
  };
  const place = (s: PlacedSpan): boolean => {
    take(s, -1);
    // only where a route can reach it through the others, used whole; where none can, it stays
    const starts = reachableStarts(placed.filter((o) => o !== s), blocks).filter((b) => b + s.end - s.start <= blocks);
    const start = starts.length > 0 ? bestStart(t, s.end - s.start, starts) : s.start;
    const moved = start !== s.start;
    s.end = start + (s.end - s.start);
    s.start = start;
    take(s, +1);
    return moved;
  };
  if (!place(mine)) return null;
  const target = mine.start;
  const others = (order ?? placed.map((s) => s.peerId)).map((id) => placed.find((s) => s.peerId === id)!).filter(Boolean);
  for (let moved = true, rounds = 0; moved && rounds < 100; rounds++) {
    moved = false;
    for (const s of others) if (place(s)) moved = true;
  }
  const after = Math.min(...t);
  if (after < EPS) return null; // never leave a block without a host
  if (initial >= EPS && initial / after > quality) return null; // not enough better to be worth a move
  return target;
}
