// Which engine a /lend tab lends (src/browser/engine-choice.ts): what it was asked for, else the GPU where it is faster
// than the CPU's engine, else WebAssembly where it runs, else js. Pure logic: no browser.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { chooseEngine } from '../../src/browser/engine-choice.ts';

test('a tab lends the faster of its GPU and its CPU engine, or what ?engine= asks for', () => {
  const software = { gflops: 2, wasmGflops: 7, webgpuGflops: 0.4 }; // SwiftShader: slower than WebAssembly
  const hardware = { gflops: 2, wasmGflops: 7, webgpuGflops: 900 };
  assert.deepEqual(chooseEngine(software, null), { engine: 'wasm', gflops: 7 });
  assert.deepEqual(chooseEngine(hardware, null), { engine: 'webgpu', gflops: 900 });
  assert.deepEqual(chooseEngine(software, 'webgpu'), { engine: 'webgpu', gflops: 0.4 });
  assert.deepEqual(chooseEngine(hardware, 'wasm'), { engine: 'wasm', gflops: 7 });
  assert.deepEqual(chooseEngine(hardware, 'js'), { engine: 'js', gflops: 2 });
  // no GPU, or no WebAssembly SIMD
  assert.deepEqual(chooseEngine({ gflops: 2, wasmGflops: 7 }, 'webgpu'), { engine: 'wasm', gflops: 7 });
  assert.deepEqual(chooseEngine({ gflops: 2 }, null), { engine: 'js', gflops: 2 });
  assert.deepEqual(chooseEngine({ gflops: 2, webgpuGflops: 3 }, null), { engine: 'webgpu', gflops: 3 });
});
