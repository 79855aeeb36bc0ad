// The js backend's GEMM in WebAssembly SIMD (src/tensor/kernels/gemm.wat) must compute the TypeScript kernel's bits: a
// validator re-runs records on the js backend and compares them bit for bit, whichever of the two each side ran (a tab
// without WebAssembly SIMD, browser-js, runs the TypeScript one).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, test } from 'node:test';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { assembleWat, bytesModule, GEMM_BYTES_TS, GEMM_WAT } from '../../scripts/wat.mjs';
import { Generator, setBackend, withBackend } from '../../src/tensor/index.ts';
import { jsBackend, jsBackendWith } from '../../src/tensor/backends/js/backend.ts';
import { GEMM_WASM, wasmGemm, wasmRuns } from '../../src/tensor/kernels/gemm-wasm.ts';
import { fastGemm, gemmNN, type MatmulSpec, matmulJs } from '../../src/tensor/kernels/matmul.ts';
import { referenceLogits } from '../../src/worker/engine-check.ts';

const ROOT = new URL('../../', import.meta.url);

function random(n: number, rng: Generator): Float32Array {
  return Float32Array.from({ length: n }, () => rng.normal() * 3);
}

const bitsOf = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('hex');

/** `gemm` against gemmNN on random operands of each shape, at offsets into longer arrays: the same bits. */
function sameBits(gemm: typeof gemmNN, shapes: number[][], rng: Generator): void {
  for (const [m, k, n] of shapes) {
    const A = random(m * k + 3, rng);
    const B = random(k * n + 5, rng);
    const js = new Float32Array(m * n + 2);
    const wasm = new Float32Array(m * n + 2);
    gemmNN(A, 3, B, 5, js, 2, m, k, n);
    gemm(A, 3, B, 5, wasm, 2, m, k, n);
    assert.equal(bitsOf(wasm), bitsOf(js), `${m}×${k}×${n}`);
  }
}

describe('the WebAssembly GEMM equals the TypeScript kernel to the bit', () => {
  test('the committed module is gemm.wat assembled (node scripts/assemble-gemm.mjs), and the js backend runs it in Node', async () => {
    const assembled = await assembleWat(fileURLToPath(new URL(GEMM_WAT, ROOT)));
    assert.equal(readFileSync(new URL(GEMM_BYTES_TS, ROOT), 'utf8'), bytesModule(assembled), 'run `node scripts/assemble-gemm.mjs` after editing gemm.wat');
    assert.deepEqual(GEMM_WASM, assembled);
    assert.ok(wasmRuns());
    assert.notEqual(fastGemm, gemmNN, 'Node has WebAssembly SIMD: the js backend\'s GEMM is the module');
  });

  test('gemmNN: every shape of the blocking (rows not a multiple of 4, odd and block-crossing columns)', () => {
    const shapes = [[1, 1, 1], [3, 17, 5], [4, 64, 256], [5, 33, 257], [7, 8, 3], [9, 100, 513], [16, 256, 96], [2, 1000, 2]];
    sameBits(wasmGemm(gemmNN), shapes, new Generator(11));
  });

  test('batched products with transposes, through the backend', () => {
    const nn = wasmGemm(gemmNN);
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
      matmulJs(A, B, js, spec, gemmNN);
      matmulJs(A, B, wasm, spec, nn);
      assert.equal(bitsOf(wasm), bitsOf(js), JSON.stringify(spec));
    }
  });

  test('products larger than the memory it holds go in blocks of rows and columns, with the same bits', () => {
    const rng = new Generator(13);
    let fellBack = 0;
    const counted: typeof gemmNN = (...args) => {
      fellBack++;
      gemmNN(...args);
    };
    // room for 6000 floats: 24×40 @ 40×1100 goes in blocks of 75 columns, 50×30 @ 30×70 in two blocks of rows
    const small = wasmGemm(counted, 6000);
    sameBits(small, [[24, 40, 1100], [50, 30, 70], [3, 40, 1100], [9, 2000, 5]], rng);
    assert.equal(fellBack, 1, 'only a k too long for four rows in the memory falls back to the TypeScript kernel');
    const f64 = new Float64Array(6);
    small(new Float64Array(6), 0, new Float64Array(6), 0, f64, 0, 2, 3, 2);
    assert.equal(fellBack, 2, 'float64 operands go to the TypeScript kernel');
  });

  test('a seeded model\'s forward: the same logits on the js backend with either GEMM', () => {
    setBackend('js');
    const hash = (l: Float32Array) => createHash('sha256').update(new Uint8Array(l.buffer, l.byteOffset, l.byteLength)).digest('hex');
    const js = hash(referenceLogits());
    assert.equal(withBackend(jsBackendWith(gemmNN), () => hash(referenceLogits())), js);
    assert.equal(withBackend(jsBackend, () => hash(referenceLogits())), js);
  });
});
