// The conformance suite (suite.ts, device-suite.ts) on the webgpu backend: onnxruntime's WebGPU provider, on the GPU
// the machine has, or on SwiftShader (a Vulkan GPU in software, in Debian's chromium-common) where it has none: the
// test runner (scripts/test.mjs) points Vulkan at SwiftShader when no other driver is named. Without an adapter the
// backend cannot be created and the suite fails with the message that says what to install.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createBackend } from '../../../src/tensor/index.ts';
import { conformance } from './suite.ts';

test('a WebGPU adapter is at hand (a GPU, or SwiftShader: VK_ICD_FILENAMES and LD_LIBRARY_PATH, see scripts/test.mjs)', () => {
  assert.doesNotThrow(() => createBackend('webgpu'));
});
conformance('webgpu');
