// The conformance suite (suite.ts) on the ort backend: every op and one block of each model family against the js
// kernels, within ort's stated tolerance.
import { test } from 'node:test';
import { ortAvailable } from '../../../src/tensor/index.ts';
import { ORT_TOLERANCES } from '../../../src/verify/index.ts';
import { conformance } from './suite.ts';

// ort's tolerance is the one verification holds its results to (src/verify/compare.ts): ORT_TOLERANCE = 3e-5 of
// relative L2 distance for float32 and bf16 weights (calibrated on sections against js), 0.1 and 0.08 for int8 and int4
// (MatMulNBits quantizes activations), on what a block adds to its input.
if (ortAvailable()) conformance('ort', { tolerance: ORT_TOLERANCES });
else test('the ort backend conforms', { skip: 'onnxruntime does not load on this machine' }, () => {});
