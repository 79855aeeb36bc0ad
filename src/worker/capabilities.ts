import { availableParallelism, freemem } from 'node:os';
import { computeName } from '../tensor/index.ts';
import { engineGflops } from './engine-check.ts';
import { type Capabilities, tierOf } from '../p2p/index.ts';

/** Measures this machine's engine: GFLOP/s of a 256³ product (a short run), cores, memory offered. */
export function measureCapabilities(memoryBytes?: number): Capabilities {
  const gflops = engineGflops();
  return {
    memoryBytes: memoryBytes ?? Math.floor(freemem() / 2),
    gflops: Math.round(gflops * 10) / 10,
    tier: tierOf(gflops),
    cores: availableParallelism(),
    backend: computeName(),
  };
}
