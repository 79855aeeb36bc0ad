// Preloaded by a test to simulate a machine where onnxruntime-node cannot load.
const Module = require('node:module');
const load = Module._load;
Module._load = function (request, ...rest) {
  if (String(request).includes('onnxruntime')) throw new Error('simulated: onnxruntime is not available here');
  return load.call(this, request, ...rest);
};
