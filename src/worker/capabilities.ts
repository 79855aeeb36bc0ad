import { availableParallelism, freemem } from 'node:os';
import { getBackend, matmul, noGrad, randn } from '../tensor/index.ts';
import { type Capabilities, tierOf } from '../p2p/index.ts';

/** Measures this machine's engine: GFLOP/s of a 256³ product (a short run), cores, memory offered. */
export function measureCapabilities(memoryBytes?: number): Capabilities {
  const n = 256;
  const a = randn([n, n], { seed: 1 });
  const b = randn([n, n], { seed: 2 });
  noGrad(() => matmul(a, b));
  const runs = 5;
  const t0 = performance.now();
  for (let i = 0; i < runs; i++) noGrad(() => matmul(a, b));
  const seconds = (performance.now() - t0) / 1000 / runs;
  const gflops = (2 * n * n * n) / seconds / 1e9;
  return {
    memoryBytes: memoryBytes ?? Math.floor(freemem() / 2),
    gflops: Math.round(gflops * 10) / 10,
    tier: tierOf(gflops),
    cores: availableParallelism(),
    backend: getBackend().name,
  };
}
