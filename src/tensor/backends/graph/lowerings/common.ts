/** Shape arithmetic the lowerings share. */

/** The broadcast shape of two shapes (numpy rules). */
export function broadcast(a: readonly number[], b: readonly number[]): number[] {
  const n = Math.max(a.length, b.length);
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const x = a[a.length - n + i] ?? 1;
    const y = b[b.length - n + i] ?? 1;
    out.push(x === 1 ? y : x);
  }
  return out;
}

/** A dim index counted from the end when negative. */
export function axis(dim: number, rank: number): number {
  return dim < 0 ? dim + rank : dim;
}
