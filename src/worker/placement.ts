/**
 * Where a host places its blocks (`worker --host-auto`), after Petals' block selection: every block's throughput is
 * the sum of its online hosts' throughputs; a host joins at the window of blocks whose throughputs are lowest, and
 * moves only when the swarm's lowest block throughput would rise by at least 1 / quality (0.75: a third), never
 * leaving a block without a host. Pure logic: the worker feeds it the model index.
 */

/** A host's span of blocks [start, end) and the throughput it adds to each of them. */
export interface PlacedSpan {
  peerId: string;
  start: number;
  end: number;
  throughput: number;
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
 * lexicographic order (its weakest block first, then its next weakest), the first such window on ties.
 */
export function bestStart(throughputs: ArrayLike<number>, length: number): number {
  let best = 0;
  let bestKey: number[] | null = null;
  for (let i = 0; i + length <= throughputs.length; i++) {
    const key = Array.from({ length }, (_, k) => throughputs[i + k]).sort((a, b) => a - b);
    if (bestKey === null || lessThan(key, bestKey)) {
      best = i;
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
 * Whether host `self` should move, and where: its span is taken out and put at its best start; then every host in
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
    const start = bestStart(t, s.end - s.start);
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
