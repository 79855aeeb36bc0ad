import { availableParallelism, freemem } from 'node:os';
import { computeDevice, computeName } from '../tensor/index.ts';
import { adapterName } from './adapter-name.ts';
import { deviceBandwidth, deviceGflops, engineGflops } from './engine-check.ts';
import { type Capabilities, tierOf } from '../p2p/index.ts';

/**
 * Measures this machine's engine: GFLOP/s of a 256³ product (a short run), cores, memory offered. On a worker that
 * computes on a device (--backend webgpu) the GFLOP/s are the device's (deviceGflops) and the memory offered is the
 * least of the host's and the device's (`deviceMemoryBytes`, --gpu-memory): a section's weights are held in both; it
 * also announces the device's adapter (as the machine reports it) and its measured read bandwidth.
 */
export function measureCapabilities(memoryBytes?: number, deviceMemoryBytes?: number): Capabilities {
  const device = computeDevice();
  const gflops = device === 'cpu' ? engineGflops() : deviceGflops(device);
  const host = memoryBytes ?? Math.floor(freemem() / 2);
  return {
    memoryBytes: device === 'cpu' || deviceMemoryBytes === undefined ? host : Math.min(host, deviceMemoryBytes),
    gflops: Math.round(gflops * 10) / 10,
    tier: tierOf(gflops),
    cores: availableParallelism(),
    backend: computeName(),
    ...(device === 'cpu' ? {} : { device: { adapter: adapterName(), bandwidthGBs: Math.round(deviceBandwidth(device) * 10) / 10 } }),
  };
}
