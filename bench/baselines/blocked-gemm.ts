/**
 * A conventional cache-blocked GEMM in plain TypeScript over Float32Array, the yardstick
 * for the js backend ("what a careful person would write by hand"): i-k-j order inside
 * 64×256×64 tiles, float32 accumulators in C.
 */
export function blockedGemm(
  A: Float32Array,
  B: Float32Array,
  C: Float32Array,
  m: number,
  k: number,
  n: number,
): void {
  const MB = 64;
  const KB = 256;
  const NB = 64;
  C.fill(0);
  for (let i0 = 0; i0 < m; i0 += MB) {
    const iEnd = Math.min(i0 + MB, m);
    for (let p0 = 0; p0 < k; p0 += KB) {
      const pEnd = Math.min(p0 + KB, k);
      for (let j0 = 0; j0 < n; j0 += NB) {
        const jEnd = Math.min(j0 + NB, n);
        for (let i = i0; i < iEnd; i++) {
          const cRow = i * n;
          const aRow = i * k;
          for (let p = p0; p < pEnd; p++) {
            const a = A[aRow + p];
            const bRow = p * n;
            for (let j = j0; j < jEnd; j++) C[cRow + j] += a * B[bRow + j];
          }
        }
      }
    }
  }
}
