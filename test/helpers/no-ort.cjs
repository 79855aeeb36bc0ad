// Preloaded by a test to simulate a machine where onnxruntime cannot load (neither its binding nor koffi).
const Module = require('node:module');
const load = Module._load;
Module._load = function (request, ...rest) {
  if (/onnxruntime|koffi/.test(String(request))) throw new Error('simulated: onnxruntime is not available here');
  return load.call(this, request, ...rest);
};
