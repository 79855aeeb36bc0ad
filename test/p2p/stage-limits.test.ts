import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { configToHF, createModel, gpt2Config } from '../../src/models/index.ts';
import { chunksOf, createNode, STAGE_PROTOCOL, type TensorLinkNode } from '../../src/p2p/index.ts';
import { sectionCopy, sectionWeights } from '../../src/pipeline/index.ts';
import { noGrad, setBackend, tensor } from '../../src/tensor/index.ts';
import { RemoteStage, ResultInbox, tensorSource } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker } from '../../src/worker/index.ts';
import { waitFor } from '../helpers/processes.ts';

const config = gpt2Config({ vocabSize: 50, hidden: 64, layers: 3, heads: 4, maxPositions: 512 });
const range: [number, number] = [1, 3];

async function setup(stallMs?: number) {
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const worker = await startWorker({ bootstrap: boot, stallMs });
  const nodes: TensorLinkNode[] = [];
  const node = async () => {
    const n = await createNode();
    nodes.push(n);
    return n;
  };
  return {
    worker,
    node,
    addr: () => worker.node.getMultiaddrs()[0],
    stop: async () => {
      await Promise.all(nodes.map((n) => Promise.resolve(n.stop()).catch(() => {})));
      await worker.stop();
      await validator.stop();
    },
  };
}

describe('limits of the stage protocol', () => {
  setBackend('js');
  const model = createModel(config, { seed: 8 });
  const hidden = (t: number) => noGrad(() => createModel(config, { section: [0, 1] }).forward(tensor(Array.from({ length: t }, (_, i) => i % 50), [1, t], 'int32')));
  const positions = (t: number) => tensor(Array.from({ length: t }, (_, i) => i), [1, t], 'int32');

  test('a peer that opens a job and never reads cannot block the worker: its stream is reset and its job freed', async () => {
    const s = await setup(1_000);
    try {
      const reader = await s.node();
      const stage = await RemoteStage.open(reader, s.addr(), 'job-silent');
      await stage.load(configToHF(config), range, tensorSource(sectionWeights(model, range)));
      // stop reading, then ask for outputs far larger than what the link buffers (each 128 KiB)
      const stream = (stage as unknown as { stream: { pause(): void } }).stream;
      stream.pause();
      const x = hidden(500);
      const answers = Array.from({ length: 64 }, (_, i) => stage.forward(`s${i}`, x, positions(500), null).catch((e: Error) => e));
      // the worker computes the forwards (js) until its writes stall for 1 s: on 2 cores shared with other test files
      // that compute alone can take 20 s, so the bound is generous; what matters is that the job is freed at all
      await waitFor('the job of the peer that does not read to be freed', async () => s.worker.stages.jobs() === 0, 60_000);
      const settled = await Promise.all(answers);
      assert.ok(settled.some((a) => a instanceof Error && a.name === 'PeerUnreachableError'), 'the silent peer lost its stream');
      // the worker goes on serving everyone else
      const other = await s.node();
      const fine = await RemoteStage.open(other, s.addr(), 'job-other');
      await fine.load(configToHF(config), range, tensorSource(sectionWeights(model, range)));
      const out = await fine.forward('a', hidden(4), positions(4), null);
      assert.deepEqual(out.data, noGrad(() => sectionCopy(model, range).forward(hidden(4), { positions: positions(4) })).data);
      await fine.close();
    } finally {
      await s.stop();
    }
  });

  test('a job owner cannot make a worker dial a peer outside the job\'s assignment', async () => {
    const s = await setup();
    try {
      const user = await s.node();
      const bystander = await s.node();
      let dialed = 0;
      await bystander.handle(STAGE_PROTOCOL, () => {
        dialed++;
      });
      const inbox = await ResultInbox.start(user);
      const stage = await RemoteStage.open(user, s.addr(), 'job-route');
      const addrs = s.worker.node.getMultiaddrs().map(String);
      const self = { peerId: s.worker.node.peerId.toString(), addrs, start: 1, end: 3, replica: 0 };
      await stage.load(configToHF(config), range, tensorSource(sectionWeights(model, range)), { assignment: [self] });
      const target = bystander.peerId.toString();
      // a chained forward routed to the bystander: refused, the error arrives at the owner's inbox
      const { requestId, result } = inbox.expect(new Set([self.peerId]), 10_000);
      await stage.forwardChained('s', [hidden(2), positions(2)], [target], requestId);
      await assert.rejects(result, { name: 'UnauthorizedError', message: /not a worker of job/ });
      // gradients reduced towards the bystander: refused before anything is sent
      await stage.call({ type: 'train-setup', lr: 1e-3, peers: [] }, []);
      const reduce = { type: 'reduce', key: 'k', names: [], peers: [self.peerId, target], index: 0 };
      await assert.rejects(stage.call(reduce, []), { name: 'UnauthorizedError' });
      // a training forward whose result would go on to the bystander: refused before it runs
      const pass = { type: 'train-forward', micro: 0, to: { peer: target, key: 'k' } };
      await assert.rejects(stage.call(pass, [hidden(2)]), { name: 'UnauthorizedError', message: /not a worker of job/ });
      // an upstream outside the assignment is refused too
      const again = await RemoteStage.open(user, s.addr(), 'job-route-2');
      await assert.rejects(
        again.load(configToHF(config), range, tensorSource(sectionWeights(model, range)), { upstream: target, assignment: [self] }),
        { name: 'UnauthorizedError', message: /not a worker of job/ },
      );
      assert.equal(dialed, 0, 'the worker never opened a stream to the bystander');
      // what re-running or disputing the job's records needs is for the owner and the verifiers it named, no one else
      const stranger = await RemoteStage.attach(bystander, s.addr(), 'job-route');
      for (const type of ['audit-index', 'audit-part', 'dispute-open', 'dispute-leaves', 'dispute-value', 'dispute-close']) {
        await assert.rejects(stranger.call({ type, step: 0, micro: 0, kind: 'forward' }, []), { name: 'UnauthorizedError' }, type);
      }
      await stranger.close();
      // the same job routed within its assignment works: the worker ends the chain and answers the owner
      const ok = inbox.expect(new Set([self.peerId]), 10_000);
      await stage.forwardChained('s2', [hidden(2), positions(2)], [], ok.requestId);
      assert.deepEqual((await ok.result).output.shape, [1, 2, 64]);
    } finally {
      await s.stop();
    }
  });

  test('manifests, chunks and sessions keep to the sizes the model gives', async () => {
    const s = await setup();
    try {
      const user = await s.node();
      const stage = await RemoteStage.open(user, s.addr(), 'job-sizes');
      const weights = sectionWeights(model, range);
      const manifest = [...weights].map(([name, t]) => ({ name, shape: [...t.shape], chunks: chunksOf(t).map((c) => c.sha) }));
      const padded = manifest.map((e, i) => (i === 0 ? { ...e, chunks: [...e.chunks, e.chunks[0]] } : e));
      await stage.call({ type: 'load', config: configToHF(config), section: range }, []);
      await assert.rejects(stage.call({ type: 'manifest', weights: padded }, []), { name: 'InvalidMessageError', message: /chunks of/ });
      await stage.call({ type: 'manifest', weights: manifest }, []);
      await assert.rejects(stage.call({ type: 'manifest', weights: manifest.slice(0, 1) }, []), { name: 'InvalidMessageError', message: /earlier manifest/ });
      const first = weights.values().next().value!;
      const [c] = chunksOf(first);
      const short = tensor(new Float32Array(c.bytes.buffer, c.bytes.byteOffset, c.bytes.length / 4).slice(0, 4), [4]);
      await assert.rejects(stage.call({ type: 'chunk', sha: c.sha }, [short]), { name: 'InvalidMessageError' });
      await stage.close();
      const fine = await RemoteStage.open(user, s.addr(), 'job-sizes-2');
      await fine.load(configToHF(config), range, tensorSource(weights));
      await fine.forward('long', hidden(500), positions(500), null);
      await assert.rejects(fine.forward('long', hidden(20), positions(20), null), { name: 'InvalidArgumentError', message: /would hold 520 positions, the model has 512/ });
      await fine.close();
    } finally {
      await s.stop();
    }
  });

  test('a worker\'s typed error reaches the user under its own name and message', async () => {
    const validator = await startValidator();
    const worker = await startWorker({ bootstrap: validator.node.getMultiaddrs()[0].toString(), memoryBytes: 1_000 });
    const user = await createNode();
    try {
      const stage = await RemoteStage.open(user, worker.node.getMultiaddrs()[0], 'job-big');
      await assert.rejects(stage.load(configToHF(config), range, tensorSource(sectionWeights(model, range))), {
        name: 'MemoryBudgetError',
        message: /section \[1, 3\) of gpt2 needs [\d.]+ MiB more; this worker has 0.0 MiB free of the 0.0 MiB it offers \(--memory\)/,
      });
    } finally {
      await user.stop();
      await worker.stop();
      await validator.stop();
    }
  });
});
