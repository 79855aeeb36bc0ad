/**
 * TensorLink's public API. Engine: tensors with autograd (PyTorch's names), two
 * backends (js: reproducible everywhere; ort: fast). nn: modules, layers, optimizers,
 * schedules. io: safetensors checkpoints.
 * @example
 * import { randn, Linear, AdamW, Generator } from 'tensorlink'
 * const layer = new Linear(4, 2, { rng: new Generator(0) })
 * const loss = layer.forward(randn([8, 4])).pow(2).mean()
 * loss.backward()
 * new AdamW(layer.parameters(), { lr: 1e-3 }).step()
 */
import './polyfills.ts';

export * from './errors.ts';
export * from './io/index.ts';
export * from './nn/index.ts';
export * from './tensor/index.ts';
export * from './models/index.ts';
export * from './data/index.ts';
export * from './node/index.ts';
export * from './plan/index.ts';
export { createNode, type NodeOptions, type TensorLinkNode } from './p2p/index.ts';
export * from './pipeline/index.ts';
