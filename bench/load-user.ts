/**
 * The user's side of one case of the `load` bench, in a process of its own so that its peak
 * resident set is the user's alone: loads a checkpoint directory (locally, or onto the workers
 * of a swarm), generates one token, and prints one JSON line (LoadUserResult) on stdout.
 *
 * usage: node --import tsx bench/load-user.ts --dir DIR --prompt 1,2,3 [--bootstrap MULTIADDR --cache-dir DIR]
 *   without --bootstrap: loadModel(DIR) and the first token in this process (the reference);
 *   with it: distribute(node, bootstrap, DIR) (the user keeps the ends, the workers' sections stream from disk).
 */
import '../src/polyfills.ts';
import { parseArgs } from 'node:util';
import { generate, loadModel } from '../src/models/index.ts';
import { createNode } from '../src/p2p/index.ts';
import { getBackend } from '../src/tensor/index.ts';
import { distribute } from '../src/user/index.ts';
import { peakRss } from '../test/helpers/rss.ts';

/** What one case measured, as the parent bench reads it. */
export interface LoadUserResult {
  /** From the start of the load to the first generated token. */
  ttftSeconds: number;
  /** From the start of the load until the model can run (loadModel, or distribute returned). */
  loadSeconds: number;
  /** Weight bytes the user sent to the workers (0 when loading locally). */
  bytesSent: number;
  /** Peak resident set of this process over its whole life (VmHWM on Linux). */
  maxRssBytes: number;
  /** Resident set after imports, the compute backend and the libp2p node started: before any loading. */
  baselineRssBytes: number;
}

const { values } = parseArgs({
  options: {
    'dir': { type: 'string' },
    'prompt': { type: 'string' },
    'bootstrap': { type: 'string' },
    'cache-dir': { type: 'string' },
  },
});
if (!values.dir || !values.prompt) throw new Error('load-user: --dir and --prompt are required');
const dir = values.dir;
const prompt = values.prompt.split(',').map(Number);
const options = { maxNewTokens: 1, temperature: 0, stopTokens: [] };

getBackend(); // onnxruntime (where it loads) is part of the process, not of the load
const node = values.bootstrap ? await createNode() : null;
const baselineRssBytes = process.memoryUsage().rss;

let loadSeconds: number;
let ttftSeconds: number;
let bytesSent = 0;
const t0 = performance.now();
if (node && values.bootstrap) {
  // bytes sent so far to each section (the progress of a section counts up)
  const sent = new Map<string, number>();
  const job = await distribute(node, values.bootstrap, dir, {
    privacy: 'ends',
    strategy: 'parameter-balanced',
    cacheDir: values['cache-dir'] ?? null,
    onProgress: (stage, p) => sent.set(`${stage.peerId}:${stage.start}`, p.sent),
  });
  loadSeconds = (performance.now() - t0) / 1000;
  await job.generate(prompt, options);
  ttftSeconds = (performance.now() - t0) / 1000;
  bytesSent = [...sent.values()].reduce((a, b) => a + b, 0);
  await job.close();
  await node.stop();
} else {
  const model = await loadModel(dir);
  loadSeconds = (performance.now() - t0) / 1000;
  await generate(model, prompt, options);
  ttftSeconds = (performance.now() - t0) / 1000;
}

const result: LoadUserResult = {
  ttftSeconds,
  loadSeconds,
  bytesSent,
  maxRssBytes: peakRss(),
  baselineRssBytes,
};
process.stdout.write(`${JSON.stringify(result)}\n`);
// libp2p and onnxruntime may keep handles open: the measurement is done
process.exit(0);
