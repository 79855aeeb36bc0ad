// The conformance suite (suite.ts) on the ort backend: every op and one block of each model family against the js
// kernels, within ort's stated tolerance.
import { test } from 'node:test';
import { createOrtBackend, ortAvailable } from '../../../src/tensor/index.ts';
import { ORT_TOLERANCES } from '../../../src/verify/index.ts';
import { conformance } from './suite.ts';

// ort's tolerance is the one verification holds its results to (src/verify/compare.ts): ORT_TOLERANCE = 3e-5 of
// relative L2 distance for float32 and bf16 weights (calibrated on sections against js), 0.1 and 0.08 for int8 and int4
// (MatMulNBits quantizes activations), on what a block adds to its input.
if (ortAvailable()) {
  conformance('ort', { tolerance: ORT_TOLERANCES });
  // every case on onnxruntime's kernels, the small shapes included (no size left to js below ORT_MIN_MACS and
  // ORT_MIN_ELEMENTS): the edges of each native op, a vector's product, one row's softmax
  const everySize = () => createOrtBackend({ minMacs: 0, minElements: 0 });
  conformance('ort', { tolerance: ORT_TOLERANCES, variant: { label: 'ort (every size native)', create: everySize } });
} else test('the ort backend conforms', { skip: 'onnxruntime does not load on this machine' }, () => {});
