import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { configToHF, createModel, gpt2Config } from '../../src/models/index.ts';
import { RemoteStage, tensorSource } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { ChunkStore, startWorker } from '../../src/worker/index.ts';
import { sectionWeights } from '../../src/pipeline/index.ts';
import { chunksOf, createNode } from '../../src/p2p/index.ts';
import { noGrad, setBackend, tensor } from '../../src/tensor/index.ts';

describe('weights as content-addressed chunks', () => {
  setBackend('js');

  test('a chunk is checked against its address; a stored chunk is checked again when read', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-store-'));
    const store = new ChunkStore(dir);
    const t = tensor(Array.from({ length: 10 }, (_, i) => i / 7), [2, 5]);
    const [c] = chunksOf(t);
    assert.throws(() => store.put(c.sha, new Uint8Array(c.bytes.length)), { name: 'InvalidMessageError', message: /does not match its hash/ });
    store.put(c.sha, c.bytes);
    assert.deepEqual(new Uint8Array(store.get(c.sha)!), c.bytes);
    writeFileSync(join(dir, c.sha), new Uint8Array(c.bytes.length)); // damaged on disk
    assert.equal(store.get(c.sha), null);
    assert.equal(new ChunkStore().get(c.sha), null, 'without a directory it keeps nothing');
  });

  test('a store keeps at most its cap: the least recently used chunks go first, in this run and after a restart', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-store-cap-'));
    const chunks = [0, 1, 2, 3].map((k) => chunksOf(tensor(Array.from({ length: 25 }, (_, i) => k + i / 7), [25]))[0]);
    const size = chunks[0].bytes.byteLength; // 100 bytes
    const store = new ChunkStore(dir, 3 * size);
    for (const c of chunks.slice(0, 3)) store.put(c.sha, c.bytes);
    assert.ok(store.get(chunks[0].sha), 'read: now the most recently used');
    store.put(chunks[3].sha, chunks[3].bytes);
    assert.deepEqual(chunks.map((c) => store.has(c.sha)), [true, false, true, true], 'chunk 1 went: used longest ago');
    assert.deepEqual({ bytes: store.bytes, evicted: store.evicted }, { bytes: 3 * size, evicted: 1 });
    assert.deepEqual(readdirSync(dir).sort(), [chunks[0].sha, chunks[2].sha, chunks[3].sha].sort());
    // started again with a smaller cap: what it finds is counted, and the oldest goes
    const again = new ChunkStore(dir, 2 * size);
    assert.equal(again.bytes, 2 * size);
    assert.equal(readdirSync(dir).length, 2);
  });

  test('a load broken off resumes with the missing chunks only; a restarted worker is sent nothing it holds', async () => {
    const config = gpt2Config({ vocabSize: 50, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
    const model = createModel(config, { seed: 4 });
    const range: [number, number] = [1, 3];
    const weights = sectionWeights(model, range);
    const dataDir = mkdtempSync(join(tmpdir(), 'tl-chunks-'));
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    let worker = await startWorker({ bootstrap: boot, dataDir });
    const user = await createNode();
    try {
      const addr = () => worker.node.getMultiaddrs()[0];
      // the user stops the first load after 5 chunks
      const first = await RemoteStage.open(user, addr(), 'job-1');
      const stop = new AbortController();
      await assert.rejects(
        first.load(configToHF(config), range, tensorSource(weights), {
          signal: stop.signal,
          onProgress: (p) => p.chunks === 5 && stop.abort(),
        }),
        /stopped after 5 chunks/,
      );
      await first.close();
      const second = await RemoteStage.open(user, addr(), 'job-2');
      const resumed = await second.load(configToHF(config), range, tensorSource(weights));
      assert.equal(resumed.chunksSent, resumed.chunks - 5, 'only the chunks that had not arrived');
      await second.close();
      // restarted with the same data directory, the worker holds every chunk: nothing is sent, and the section computes
      await worker.stop();
      worker = await startWorker({ bootstrap: boot, dataDir });
      const third = await RemoteStage.open(user, addr(), 'job-3');
      const again = await third.load(configToHF(config), range, tensorSource(weights));
      assert.equal(again.chunksSent, 0);
      const x = noGrad(() => createModel(config, { section: [0, 1] }).forward(tensor([1, 2, 3], [1, 3], 'int32')));
      const positions = tensor([0, 1, 2], [1, 3], 'int32');
      const local = noGrad(() => {
        const part = createModel(config, { section: range });
        part.loadStateDict(weights);
        return part.forward(x, { positions });
      });
      assert.deepEqual((await third.forward('s', x, positions, null)).data, local.data);
      await third.close();
      // a chunk the manifest does not list is refused: a peer cannot fill a worker's store
      const fourth = await RemoteStage.open(user, addr(), 'job-4');
      const manifest = [...weights].map(([name, t]) => ({ name, shape: [...t.shape], chunks: chunksOf(t).map((x) => x.sha) }));
      await fourth.call({ type: 'load', config: configToHF(config), section: range }, []);
      await fourth.call({ type: 'manifest', weights: manifest }, []);
      const junk = tensor([1, 2, 3, 4], [4]);
      const [c] = chunksOf(junk);
      await assert.rejects(fourth.call({ type: 'chunk', sha: c.sha, tensors: 1 }, [junk]), { name: 'InvalidMessageError', message: /no manifest lists/ });
      await fourth.close();
    } finally {
      await user.stop();
      await worker.stop();
      await validator.stop();
    }
  });
});
