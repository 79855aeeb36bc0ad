// Issue #30: a compact job's sections travel in their format. The user packs each matrix as it reads it, the manifest
// addresses the packed bytes, the worker reserves and holds only those, and a worker that holds them is sent nothing.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { CheckpointWeights, configToHF, generate, hfToGGUF, loadConfig, loadModel, partBytes, partHeldBytes } from '../../src/models/index.ts';
import { CHUNK_BYTES, createNode } from '../../src/p2p/index.ts';
import { checkpointSource, distribute, listPeers, RemoteStage } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';
import { noGrad, setBackend, tensor, type WeightFormat } from '../../src/tensor/index.ts';
import { readHFReference } from '../helpers/hf-fixtures.ts';
import { inProcessSwarm } from '../helpers/in-process-swarm.ts';

describe('compact sections on the wire', () => {
  setBackend('js');

  test('sent packed, held packed, computed as one process holds them, and reused by a worker that holds them', async () => {
    const ref = readHFReference('llama3');
    const config = loadConfig(ref.dir);
    const range: [number, number] = [1, config.layers + 1];
    const ckpt = CheckpointWeights.open(ref.dir, { chunkBytes: CHUNK_BYTES, cacheDir: null });
    const dataDir = mkdtempSync(join(tmpdir(), 'tl-compact-load-'));
    const validator = await startValidator();
    const boot = validator.node.getMultiaddrs()[0].toString();
    const worker = await startWorker({ bootstrap: boot, dataDir });
    const user = await createNode();
    try {
      const addr = worker.node.getMultiaddrs()[0];
      const ends = await loadModel(ref.dir, { part: 'ends' });
      const [batch, time] = ref.inputIds.shape;
      const positions = tensor(Array.from({ length: batch * time }, (_, i) => i % time), [batch, time], 'int32');
      const x = noGrad(() => ends.layers[0].forward(ref.inputIds, { positions, keyMask: null, cache: null }));
      const f32 = partBytes(config, range);
      for (const format of ['bf16', 'int8', 'int4'] as WeightFormat[]) {
        const source = checkpointSource(ckpt, range, format);
        const stage = await RemoteStage.open(user, addr, `job-${format}`);
        const loaded = await stage.load(configToHF(config), range, source, { format });
        const held = partHeldBytes(config, range, format);
        // what arrived is what the worker holds: the matrices packed, the norms in float32 (the same chunks at every
        // format: after the first, the worker's store holds them)
        assert.equal(loaded.bytesSent + loaded.bytesReused, held);
        assert.ok(loaded.bytesReused < 0.02 * held);
        assert.equal(source.weights.reduce((n, w) => n + w.bytes, 0), held);
        const local = await loadModel(ref.dir, { part: range, ...(format === 'bf16' ? { dtype: 'bf16' } : { quantize: format }) });
        const want = noGrad(() => local.forward(x, { positions }));
        assert.deepEqual((await stage.forward('s', x, positions, null)).data, want.data, `${format}: the section computes as one process's`);
        process.stderr.write(`${format}: section of ${f32} float32 bytes sent as ${loaded.bytesSent} (${(loaded.bytesSent / f32).toFixed(3)})\n`);
        assert.ok(loaded.bytesSent < (format === 'bf16' ? 0.51 : format === 'int8' ? 0.3 : 0.2) * f32);
        await stage.close();
        // a second job of the same model and format: the worker holds every chunk (its data directory) and is sent nothing
        const again = await RemoteStage.open(user, addr, `job-${format}-again`);
        const reloaded = await again.load(configToHF(config), range, checkpointSource(ckpt, range, format), { format });
        assert.equal(reloaded.chunksSent, 0);
        assert.equal(reloaded.bytesReused, held);
        assert.deepEqual((await again.forward('s', x, positions, null)).data, want.data);
        if (format === 'int4') {
          // the worker announces what it holds: `status` shows the section's layers, format and bytes
          let listed: unknown;
          for (let i = 0; i < 40 && !listed; i++) {
            const me = (await listPeers(user, validator.node.getMultiaddrs()[0])).find((p) => p.peerId === worker.node.peerId.toString());
            listed = me?.sections?.find((s) => s.format === 'int4');
            if (!listed) await new Promise((r) => setTimeout(r, 100));
          }
          assert.deepEqual(listed, { layers: range, format: 'int4', bytes: held });
        }
        await again.close();
      }
      // a manifest that sends a matrix of an int4 job in float32 is refused, naming the weight
      const wrong = await RemoteStage.open(user, addr, 'job-wrong');
      await wrong.call({ type: 'load', config: configToHF(config), section: range, format: 'int4' }, []);
      const w = ckpt.partWeights(range).find((e) => e.shape.length === 2)!;
      await assert.rejects(
        wrong.call({ type: 'manifest', weights: [{ name: w.name, shape: w.shape, chunks: await ckpt.hashes(w.name) }] }, []),
        { name: 'InvalidMessageError', message: /travels packed in int4 for this section, the manifest says float32/ },
      );
      await wrong.close();
    } finally {
      ckpt.close();
      await user.stop();
      await worker.stop();
      await validator.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  test('a GGUF file across workers: its Q4_0 blocks travel as they are, and the tokens equal one process on the file', async () => {
    const ref = readHFReference('llama3');
    const dir = mkdtempSync(join(tmpdir(), 'tl-compact-gguf-'));
    const swarm = await inProcessSwarm(2);
    try {
      const path = join(dir, 'llama3-q4_0.gguf');
      const model = await loadModel(ref.dir);
      const state = model.hfStateDict();
      await hfToGGUF(path, {
        config: configToHF(model.config), tokenizer: null, type: 'q4_0',
        weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape] })), read: (name) => state.get(name)!,
      });
      const options = { maxNewTokens: 12, temperature: 0, stopTokens: [] };
      for (const quantize of ['int4', undefined] as const) {
        const local = await loadModel(path, quantize ? { quantize } : {});
        const want = await generate(local, ref.prompt, options);
        let sent = 0;
        const dm = await distribute(swarm.user, swarm.boot, path, {
          strategy: 'parameter-balanced', cacheDir: null, verify: { sampleRate: 0 }, ...(quantize ? { quantize } : {}),
          onProgress: (_stage, p) => (sent = Math.max(sent, p.total)),
        });
        try {
          assert.equal(new Set(dm.assignment.map((a) => a.peerId)).size, 2);
          const { tokens } = await dm.generate(ref.prompt, options);
          assert.deepEqual(tokens, want.tokens, `${quantize ?? 'f32'}: the tokens of one process on the file`);
          process.stderr.write(`GGUF Q4_0 over 2 workers at ${quantize ?? 'f32'}: ${tokens.length} tokens equal one process's\n`);
        } finally {
          await dm.close();
        }
      }
    } finally {
      await swarm.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
