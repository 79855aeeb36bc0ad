/**
 * The user side of a job as its own process, so that its resident memory is its own:
 * `node --import tsx test/helpers/ends-user.ts BOOTSTRAP MODEL-DIR checkpoint|memory OUT-DIR CACHE-DIR`
 * distributes the model (from the checkpoint directory, or loaded whole), generates, trains one
 * step (its loss, and the update the saved weights show), saves the trained model to OUT-DIR and
 * prints one JSON line: tokens, losses, the bytes of weights it holds, and its resident set before,
 * after loading and at its peak.
 */
import '../../src/polyfills.ts';
import { loadModel } from '../../src/models/index.ts';
import { createNode } from '../../src/p2p/index.ts';
import { randint, setBackend, tensor } from '../../src/tensor/index.ts';
import { distribute } from '../../src/user/index.ts';
import { peakRss } from './rss.ts';

const [bootstrap, dir, mode, out, cacheDir] = process.argv.slice(2);
setBackend('js');
const node = await createNode();
const baselineRss = process.memoryUsage().rss;
const dm = await distribute(node, bootstrap, mode === 'checkpoint' ? dir : await loadModel(dir), { strategy: 'parameter-balanced', cacheDir, verify: { sampleRate: 0 } });
const loadedRss = process.memoryUsage().rss;
const { tokens } = await dm.generate([1, 2, 3, 4], { maxNewTokens: 6, temperature: 0, stopTokens: [] });
const trainer = await dm.trainer({ optimizer: { lr: 1e-3 }, totalSteps: 1, microBatches: 2, schedule: '1f1b' });
const input = randint(0, 256, [2, 8], { seed: 10 });
const target = tensor(Array.from(input.data, (v) => (v * 7 + 3) % 256), [2, 8], 'int32');
const losses = [(await trainer.step({ input, target })).loss];
await dm.save(out, { maxShardBytes: 16 * 1024 ** 2 });
const heldBytes = dm.source.heldBytes;
await dm.close();
await node.stop();
process.stdout.write(`${JSON.stringify({ tokens, losses, heldBytes, baselineRss, loadedRss, peakRss: peakRss() })}\n`);
process.exit(0);
