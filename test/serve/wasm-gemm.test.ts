// A tab's WebAssembly engine (web/lend/gemm.wat, browser-wasm) must compute the js backend's bits: a validator re-runs
// a tab's records on the js backend and compares them bit for bit. Node runs the same module (WebAssembly SIMD).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import { assembleWat } from '../../scripts/wat.mjs';
import { Generator, setBackend, withBackend } from '../../src/tensor/index.ts';
import { gemmNN, type MatmulSpec, matmulJs } from '../../src/tensor/kernels/matmul.ts';
import { referenceLogits } from '../../src/worker/engine-check.ts';
import { wasmBackend, wasmGemm } from '../../web/lend/wasm-gemm.ts';

const bytes = await assembleWat(fileURLToPath(new URL('../../web/lend/gemm.wat', import.meta.url)));

function random(n: number, rng: Generator): Float32Array {
  return Float32Array.from({ length: n }, () => rng.normal() * 3);
}

const bitsOf = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

describe('the tab\'s WebAssembly GEMM equals the js backend to the bit', () => {
  test('gemmNN: every shape of the blocking (rows not a multiple of 4, odd and block-crossing columns)', () => {
    const gemm = wasmGemm(bytes);
    const rng = new Generator(11);
    for (const [m, k, n] of [[1, 1, 1], [3, 17, 5], [4, 64, 256], [5, 33, 257], [7, 8, 3], [9, 100, 513], [16, 256, 96], [2, 1000, 2]]) {
      const A = random(m * k + 3, rng);
      const B = random(k * n + 5, rng);
      const js = new Float32Array(m * n + 2);
      const wasm = new Float32Array(m * n + 2);
      gemmNN(A, 3, B, 5, js, 2, m, k, n);
      gemm(A, 3, B, 5, wasm, 2, m, k, n);
      assert.equal(bitsOf(wasm), bitsOf(js), `${m}×${k}×${n}`);
    }
  });

  test('batched products with transposes, through the backend', () => {
    const nn = wasmGemm(bytes);
    const rng = new Generator(12);
    for (const spec of [
      { batch: 3, m: 12, k: 20, n: 9, transA: false, transB: true, batchedA: true, batchedB: false },
      { batch: 2, m: 6, k: 7, n: 300, transA: true, transB: false, batchedA: true, batchedB: true },
      { batch: 1, m: 33, k: 64, n: 64, transA: false, transB: false, batchedA: false, batchedB: false },
    ] satisfies MatmulSpec[]) {
      const A = random(spec.batch * spec.m * spec.k, rng);
      const B = random(spec.batch * spec.k * spec.n, rng);
      const js = new Float32Array(spec.batch * spec.m * spec.n);
      const wasm = new Float32Array(js.length);
      matmulJs(A, B, js, spec);
      matmulJs(A, B, wasm, spec, nn);
      assert.equal(bitsOf(wasm), bitsOf(js), JSON.stringify(spec));
    }
  });

  test('a seeded model\'s forward: the same logits as the js backend', () => {
    setBackend('js');
    const hash = (l: Float32Array) => createHash('sha256').update(new Uint8Array(l.buffer, l.byteOffset, l.byteLength)).digest('hex');
    const js = hash(referenceLogits());
    const wasm = withBackend(wasmBackend(bytes), () => hash(referenceLogits()));
    assert.equal(wasm, js);
  });
});
