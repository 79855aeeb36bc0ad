import { createModel, llamaConfig } from '../models/index.ts';
import { type Device, jsBackend, matmul, noGrad, randn, type Tensor, tensor, trace, type TracedStep, withBackend } from '../tensor/index.ts';

/**
 * What a machine's engine does, measured the same way wherever it runs (a Node worker, a browser tab): its speed, and a
 * seeded forward pass whose logits a validator on another machine must reproduce bit for bit to re-execute its work.
 * Nothing here touches the machine beyond the engine (no files, no OS): a tab bundles it as it is.
 */

/** GFLOP/s of a 256³ matrix product on the current backend (a warm-up, then the mean of 5). */
export function engineGflops(): number {
  const n = 256;
  const a = randn([n, n], { seed: 1 });
  const b = randn([n, n], { seed: 2 });
  noGrad(() => matmul(a, b));
  const runs = 5;
  const t0 = performance.now();
  for (let i = 0; i < runs; i++) noGrad(() => matmul(a, b));
  const seconds = (performance.now() - t0) / 1000 / runs;
  return (2 * n * n * n) / seconds / 1e9;
}

/**
 * Runs a traced step whose one output is a small tensor on a device, and waits for the device's work: reading one value
 * back does (onnxruntime-node's WebGPU provider copies out before it returns).
 */
function runToEnd(step: TracedStep<Tensor>, inputs: Tensor[]): void {
  const out = noGrad(() => step.run(inputs));
  const storage = out.deviceStorage;
  if (storage !== null) void storage.backend.allocator.copyout(storage.handle, new Float32Array(1));
  out.dispose();
}

/**
 * GFLOP/s of a device (webgpu): a chain of four 256³ products traced once and run as one graph there, its inputs on the
 * device and one value read back per run (a warm-up, then the mean of 3): the device's arithmetic with one dispatch
 * chain per step, as a section's steps run on it.
 */
export function deviceGflops(device: Device): number {
  const n = 256;
  const chain = 4;
  const a = randn([n, n], { seed: 1 });
  const b = randn([n, n], { seed: 2 });
  const fn = (x: Tensor, w: Tensor) => {
    let y = x;
    for (let i = 0; i < chain; i++) y = matmul(y, w);
    return y.narrow(0, 0, 1).narrow(1, 0, 1);
  };
  const { step } = withBackend(jsBackend, () => noGrad(() => trace(fn, [a, b])));
  const inputs = [a.to(device), b.to(device)];
  const once = () => runToEnd(step, inputs);
  once();
  const runs = 3;
  const t0 = performance.now();
  for (let i = 0; i < runs; i++) once();
  const seconds = (performance.now() - t0) / 1000 / runs;
  for (const t of inputs) t.dispose();
  return (chain * 2 * n * n * n) / seconds / 1e9;
}

/**
 * Read bandwidth of a device in GB/s: a tensor on the device summed by one graph there (a warm-up, then the best of
 * 3), from 4 MiB up to 128 MiB (WebGPU's default limit for one storage buffer) while a run takes under 5 ms: what a
 * decoding step, which reads every weight once, is bound by. On a fast GPU 128 MiB reads in well under 5 ms, so the
 * launch and the read back of the sum weigh in and the figure is a lower bound.
 */
export function deviceBandwidth(device: Device): number {
  for (let rows = 1024; ; rows *= 2) {
    const x = randn([rows, 1024], { seed: 3 });
    const { step } = withBackend(jsBackend, () => noGrad(() => trace((v: Tensor) => v.sum(), [x])));
    const input = x.to(device);
    let best = Infinity;
    for (let i = 0; i < 4; i++) {
      const t0 = performance.now();
      runToEnd(step, [input]);
      if (i > 0) best = Math.min(best, (performance.now() - t0) / 1000);
    }
    input.dispose();
    if (best >= 0.005 || rows >= 32768) return (4 * x.size) / best / 1e9;
  }
}

/** The logits [1, 8, 257] of a small seeded Llama (2 blocks, hidden 64) on 8 fixed tokens: the same bytes on every machine (js backend). */
export function referenceLogits(): Float32Array {
  const config = llamaConfig({ vocabSize: 257, hidden: 64, layers: 2, heads: 4, kvHeads: 2, intermediate: 96, maxPositions: 32 });
  const model = createModel(config, { seed: 11 });
  const ids = tensor([3, 1, 4, 1, 5, 9, 2, 6], [1, 8], 'int32');
  return noGrad(() => model.forward(ids)).data as Float32Array;
}
