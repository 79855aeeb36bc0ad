import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createModel, gpt2Config } from '../../src/models/index.ts';
import { DctTopkCodec } from '../../src/compress/index.ts';
import { GradientExchange, StageExecutor } from '../../src/pipeline/index.ts';
import { setBackend, tensor } from '../../src/tensor/index.ts';

describe('gradient exchange', () => {
  setBackend('js');
  const model = createModel(gpt2Config({ vocabSize: 20, hidden: 8, layers: 1, heads: 2, maxPositions: 8 }), { seed: 1 });
  const executor = new StageExecutor(model.layers.slice(1, 2), 8, { lr: 1e-3 });
  const names = [...executor.named.keys()].slice(0, 1);

  test('a reduction that fails (a send, or a replica that never answers) holds no slot afterwards', async () => {
    const exchange = new GradientExchange();
    for (let i = 0; i < 100; i++) {
      const group = { key: `step-${i}`, names, peers: ['a', 'b'], index: 0 };
      exchange.deliver(group.key, 1, [tensor([1], [1])]);
      await assert.rejects(exchange.reduce(executor, group, async () => {
        throw new Error('link down');
      }));
    }
    // 100 failed steps later, a reduction still goes through
    const w = executor.named.get(names[0])!;
    const group = { key: 'ok', names, peers: ['a', 'b'], index: 0 };
    exchange.deliver('ok', 1, [tensor(new Float32Array(w.size).fill(2), w.shape)]);
    await exchange.reduce(executor, group, async () => {});
    assert.equal(executor.grads(names)[0].data[0], 2);
    await assert.rejects(exchange.reduce(executor, { key: 'late', names, peers: ['a', 'b'], index: 0 }, async () => {}, 20), { name: 'TimeoutError' });
  });
});

describe('local steps: averaging the replicas\' weights', () => {
  setBackend('js');
  const config = gpt2Config({ vocabSize: 20, hidden: 64, layers: 1, heads: 2, maxPositions: 8 });
  const make = () => new StageExecutor(createModel(config, { seed: 1 }).layers.slice(1, 2), 8, { lr: 1e-3 });
  /** Two holders of one section, anchored at the same weights, then moved apart. */
  const pair = (codec: () => DctTopkCodec | null) => {
    const holders = [make(), make()].map((executor) => ({ executor, exchange: new GradientExchange(codec()) }));
    for (const h of holders) h.exchange.anchor(h.executor);
    const names = [...holders[0].executor.named.keys()];
    const start = names.map((n) => (holders[0].executor.named.get(n)!.data as Float32Array).slice());
    holders.forEach((h, j) => {
      for (const p of h.executor.named.values()) {
        const w = p.data as Float32Array;
        for (let i = 0; i < w.length; i++) w[i] += j === 0 ? 0.01 * Math.sin(i) : -0.02 * Math.cos(3 * i);
      }
    });
    const moved = holders.map((h) => names.map((n) => (h.executor.named.get(n)!.data as Float32Array).slice()));
    let round = 0;
    const average = async () => {
      const key = `sync:${round++}`;
      await Promise.all(holders.map((h, index) => h.exchange.average(h.executor, { key, names, peers: ['a', 'b'], index }, async (_peer, payload) => {
        holders[1 - index].exchange.deliver(key, index, payload);
      })));
      return holders.map((h) => names.map((n) => (h.executor.named.get(n)!.data as Float32Array).slice()));
    };
    // how far the holders are from anchor + the mean change (the mean of the moved weights), at most
    const mean = (j: number, i: number) => (moved[0][j][i] + moved[1][j][i]) / 2;
    const error = (w: Float32Array[]) => Math.max(...w.map((t, j) => Math.max(...t.map((v, i) => Math.abs(v - mean(j, i))))));
    return { names, start, average, error };
  };

  test('float32 averages: both holders end bit for bit the same, at the mean of their weights; a second average changes nothing', async () => {
    const { average, error } = pair(() => null);
    const [a, b] = await average();
    assert.deepEqual(a, b);
    assert.ok(error(a) < 1e-6, `${error(a)}`);
    const [a2, b2] = await average();
    assert.deepEqual(a2, a);
    assert.deepEqual(b2, b);
  });

  test('DCT top-k averages: both holders the same; what one average leaves out the next sends (error feedback)', async () => {
    const { average, error } = pair(() => new DctTopkCodec({ k: 256, chunk: 64, bits: 8 }));
    const [a, b] = await average();
    assert.deepEqual(a, b);
    const first = error(a);
    assert.ok(first > 1e-4, `k=256 of 4096 leaves part of the change out (${first})`);
    const [a2, b2] = await average();
    assert.deepEqual(a2, b2);
    assert.ok(error(a2) < first, `${error(a2)} after a second average, ${first} after the first`);
  });

  test('an average before an anchor is a typed error', async () => {
    const executor = make();
    const names = [...executor.named.keys()];
    await assert.rejects(new GradientExchange().average(executor, { key: 'x', names, peers: ['a', 'b'], index: 0 }, async () => {}), { name: 'InvalidArgumentError' });
  });
});
