// The tab's engine, in a Web Worker (the page stays responsive while it computes): TensorLink's js backend, bundled as
// it is, measures its speed and computes the seeded reference forward whose logits every machine must reproduce bit for
// bit (src/worker/engine-check.ts). Posts { gflops, logitsSha256, ms } to the page.
import { sha256 } from '@noble/hashes/sha2.js';
import { bytesToHex } from '@noble/hashes/utils.js';
import { setBackend } from '../../src/tensor/index.ts';
import { engineGflops, referenceLogits } from '../../src/worker/engine-check.ts';

setBackend('js');
try {
  const t0 = performance.now();
  const logits = referenceLogits();
  const ms = performance.now() - t0;
  const logitsSha256 = bytesToHex(sha256(new Uint8Array(logits.buffer, logits.byteOffset, logits.byteLength)));
  postMessage({ gflops: engineGflops(), logitsSha256, ms });
} catch (err) {
  postMessage({ error: (err as Error).message });
}
