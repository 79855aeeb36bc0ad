import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import type { Stream } from '@libp2p/interface';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { configToHF, createModel, gpt2Config } from '../../src/models/index.ts';
import {
  createNode, encodeControl, encodeTensor, type Frame, INFERENCE_REQUESTS, LOAD_REQUESTS, MAX_CONTROL_BYTES, MAX_TENSORS_PER_REQUEST,
  parseStatsAnswer, receiveFrames, request, STAGE_PROTOCOL, type TensorLinkNode, TRAINING_REQUESTS,
} from '../../src/p2p/index.ts';
import { sectionCopy, sectionWeights } from '../../src/pipeline/index.ts';
import { Generator, noGrad, setBackend, tensor } from '../../src/tensor/index.ts';
import { RemoteStage, tensorSource } from '../../src/user/index.ts';
import { concat } from '../helpers/bytes.ts';
import { alive, type Running, startNode, waitFor } from '../helpers/processes.ts';

/** The worker's stage requests per peer per second in this test (`--max-requests`). */
const RATE = 500;
const TYPES = [...LOAD_REQUESTS, ...INFERENCE_REQUESTS, ...TRAINING_REQUESTS, 'frob', '__proto__', 'constructor'];
/** The fields each request type reads: the fuzzer fills them with values no schema accepts. */
const FIELDS: Record<string, string[]> = {
  'load': ['config', 'section', 'upstream', 'assignment'],
  'manifest': ['weights'],
  'chunk': ['sha'],
  'assign': ['assignment', 'upstream'],
  'forward': ['sessionId', 'route', 'replyTo'],
  'close': ['sessionId'],
  'train-setup': ['lr', 'weightDecay', 'peers'],
  'train-forward': ['micro'],
  'train-backward': ['micro'],
  'grad-squares': ['names'],
  'reduce': ['key', 'names', 'peers', 'index'],
  'grads': ['key', 'index'],
  'step': ['scale', 'lr'],
  'weight': ['name'],
  'moment-steps': ['names'],
  'moments': ['name'],
  'set-moments': ['name', 'step'],
};

/** Values that are wrong for every field of every schema (wrong type, negative, too long, too deep). */
const BAD: unknown[] = [null, -1, -0.5, 'x'.repeat(5_000), [[[]]], { a: { b: {} } }, true, ['a'.repeat(600)], [1, 2, 3], { constructor: 1 }];

const floats = (shape: number[], id: number) => encodeTensor({ requestId: id, dtype: 'float32', shape, bytes: new Uint8Array(4 * shape.reduce((a, b) => a * b, 1)) });

/** One bad message (as the bytes to write) of `type`, of corruption `kind`, for job `jobId`. */
function badMessage(i: number, type: string, kind: number, jobId: string, rng: Generator): Uint8Array {
  const pick = <T>(xs: readonly T[]) => xs[rng.int(xs.length)];
  switch (kind) {
    case 0: {
      // malformed fields: every field the type reads holds a value no schema accepts
      const body: Record<string, unknown> = { id: i, type, jobId, tensors: 0 };
      for (const f of FIELDS[type] ?? ['x']) body[f] = pick(BAD);
      return encodeControl(body);
    }
    case 1: {
      // truncated: a request with its tensor, cut anywhere
      const whole = concat([encodeControl({ id: i, type, jobId, tensors: 1, micro: 0, sessionId: 's', name: 'w' }), ...floats([2, 3], i)]);
      return whole.subarray(0, 1 + rng.int(whole.length - 1));
    }
    case 2: {
      // oversized: too many tensors announced, a control message over the limit, a frame length beyond any limit, a shape beyond its bytes
      const which = rng.int(4);
      if (which === 0) return encodeControl({ id: i, type, jobId, tensors: MAX_TENSORS_PER_REQUEST + 1 });
      if (which === 1) {
        const body = new TextEncoder().encode(JSON.stringify({ id: i, type, jobId, pad: 'x'.repeat(MAX_CONTROL_BYTES + 10) }));
        const head = new Uint8Array(5);
        new DataView(head.buffer).setUint32(0, body.length + 1, true);
        head[4] = 1;
        return concat([head, body]);
      }
      if (which === 2) return Uint8Array.from([0xff, 0xff, 0xff, 0xff, 1, 0x7b]);
      const [head] = floats([1 << 16, 1 << 16], i);
      return concat([encodeControl({ id: i, type, jobId, tensors: 1 }), head, new Uint8Array(16)]);
    }
    case 3: {
      // out of order: tensors with no request, a request abandoned by the next one, work for a state the job is not in
      const which = rng.int(3);
      if (which === 0) return concat(floats([4], i + 1_000_000));
      if (which === 1) return concat([encodeControl({ id: i, type, jobId, tensors: 2 }), ...floats([4], i), encodeControl({ id: i + 1, type: 'close', jobId })]);
      const early: Record<string, unknown> = { 'train-backward': { micro: 7 }, 'step': { scale: 1, lr: 1e-3 }, 'assemble': {}, 'moments': { name: 'h.0.attn.c_attn.weight' } };
      const t = pick(Object.keys(early));
      return concat([encodeControl({ id: i, type: t, jobId, tensors: t === 'train-backward' ? 1 : 0, ...(early[t] as object) }), ...(t === 'train-backward' ? floats([1, 2, 32], i) : [])]);
    }
    case 4: {
      // wrong tensors: the right header with a tensor of another dtype, rank or size
      const wrong = pick([
        encodeTensor({ requestId: i, dtype: 'float64', shape: [3], bytes: new Uint8Array(24) }),
        encodeTensor({ requestId: i, dtype: 'int32', shape: [1, 2, 32], bytes: new Uint8Array(256) }),
        encodeTensor({ requestId: i, dtype: 'float16', shape: [2], bytes: new Uint8Array(4) }),
        floats([7, 7, 7, 7, 7], i),
      ]);
      return concat([encodeControl({ id: i, type, jobId, tensors: 1, micro: 0, sessionId: 'fuzz', name: 'x', key: 'k', index: 0, step: 1 }), ...wrong]);
    }
    default:
      // not JSON, not a frame
      return Uint8Array.from({ length: 1 + rng.int(48) }, () => rng.int(256));
  }
}

describe('the stage protocol under 10,000 malformed, truncated, oversized and out-of-order messages', () => {
  setBackend('js');
  const running: Running[] = [];
  const nodes: TensorLinkNode[] = [];
  after(async () => {
    for (const r of running) if (alive(r.child)) r.child.kill('SIGKILL');
    await Promise.all(nodes.map((n) => Promise.resolve(n.stop()).catch(() => {})));
  });

  test('a worker process stays up, answers with typed errors, frees what the bad peer opened and serves its owner exactly', async () => {
    const validator = await startNode(['validator', '--backend', 'js']);
    running.push(validator);
    // a low rate limit, so that a flood outruns it even on a loaded machine (the limit engages only when the worker
    // reads requests faster than it allows; at the default 5,000 a second, a busy CI machine read them more slowly)
    const worker = await startNode(['worker', '--bootstrap', validator.addrs[0], '--backend', 'js', '--memory', '1GiB', '--max-requests', String(RATE)]);
    running.push(worker);
    const addr: Multiaddr = multiaddr(worker.addrs[0]);
    const [owner, stranger, watcher] = await Promise.all([createNode(), createNode(), createNode()]);
    nodes.push(owner, stranger, watcher);
    const stats = async () => parseStatsAnswer(await request(watcher, addr, { type: 'stats' }, 5_000));

    // the owner's job: a section of a small GPT-2, loaded and checked
    const config = gpt2Config({ vocabSize: 50, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
    const model = createModel(config, { seed: 3 });
    const range: [number, number] = [1, 3];
    const stage = await RemoteStage.open(owner, addr, 'job-owner');
    await stage.load(configToHF(config), range, tensorSource(sectionWeights(model, range)));
    const x = noGrad(() => createModel(config, { section: [0, 1] }).forward(tensor([1, 2, 3], [1, 3], 'int32')));
    const positions = tensor([0, 1, 2], [1, 3], 'int32');
    const expected = noGrad(() => sectionCopy(model, range).forward(x, { positions })).data;

    // the stranger opens jobs of its own (and loads nothing that works into them)
    for (const j of ['bad-0', 'bad-1', 'bad-2']) await request(stranger, addr, { type: 'open-job', jobId: j });
    assert.equal((await stats()).jobs, 4);

    const rng = new Generator(12);
    const names = new Map<string, number>();
    const listen = (s: Stream) =>
      receiveFrames(s, (f: Frame) => {
        const error = f.kind === 'control' ? (f.message as { error?: string }).error : undefined;
        if (error) names.set(error, (names.get(error) ?? 0) + 1);
      });
    const TOTAL = 10_000;
    const PER_STREAM = 50;
    let sent = 0;
    while (sent < TOTAL) {
      // from the owner (its own job) and from the stranger (its jobs, the owner's job, jobs that do not exist)
      const fromOwner = (sent / PER_STREAM) % 2 === 0;
      const stream = await (fromOwner ? owner : stranger).dialProtocol(addr, STAGE_PROTOCOL);
      listen(stream);
      for (let k = 0; k < PER_STREAM; k++, sent++) {
        const type = TYPES[sent % TYPES.length];
        const kind = Math.floor(sent / TYPES.length) % 6;
        const jobId = fromOwner ? 'job-owner' : ['job-owner', 'bad-0', 'bad-1', 'nope', '../x'][rng.int(5)];
        try {
          stream.send(badMessage(sent + 1, type, kind, jobId, rng));
        } catch {
          sent += PER_STREAM - k - 1; // the worker reset this stream (broken framing): the rest of the batch counts as sent
          break;
        }
      }
      await new Promise((r) => setTimeout(r, 5));
      stream.abort(new Error('next batch'));
    }
    assert.ok(alive(worker.child) && alive(validator.child), 'both processes are still up');
    assert.ok((names.get('InvalidMessageError') ?? 0) > 100, `typed errors came back: ${JSON.stringify(Object.fromEntries(names))}`);
    assert.ok((names.get('UnauthorizedError') ?? 0) > 0, `the stranger was refused the owner's job: ${JSON.stringify(Object.fromEntries(names))}`);
    assert.ok(![...names.keys()].some((n) => n === 'TensorLinkError'), `no internal errors: ${JSON.stringify(Object.fromEntries(names))}`);

    // a flood of well-formed requests beyond the rate: refused with RateLimitedError, others unaffected
    const flood = await stranger.dialProtocol(addr, STAGE_PROTOCOL);
    const refused: number[] = [];
    receiveFrames(flood, (f) => {
      if (f.kind === 'control' && (f.message as { error?: string }).error === 'RateLimitedError') refused.push(1);
    });
    // the limit engages when messages are read faster than it allows: ten times the rate at once needs the worker to
    // read little more than RATE a second; the flood is sent again until the refusals come (a liveness check, not a speed figure)
    let id = 0;
    let flooded = 0;
    await waitFor('rate-limited answers', async () => {
      if (refused.length === 0 && Date.now() - flooded > 3_000) {
        flooded = Date.now();
        for (let i = 0; i < 10 * RATE; i++) flood.send(encodeControl({ id: ++id, type: 'close', jobId: 'bad-0', sessionId: 's' }));
      }
      return refused.length > 0;
    }, 60_000);
    flood.abort(new Error('done'));

    // the owner's job computes exactly as before, on the same stage stream
    const out = await stage.forward('check', x, positions, null);
    assert.deepEqual(out.data, expected);
    // the stranger leaves: every job it opened is freed; the owner's stays
    await stranger.stop();
    await waitFor('the stranger\'s jobs to be freed', async () => (await stats()).jobs === 1, 10_000);
    const after = await stats();
    assert.equal(after.sessions, 1, 'only the owner\'s check session is open');
    await stage.closeSession('check');
    await stage.close();
    await waitFor('the owner\'s job to end with its stream', async () => (await stats()).jobs === 0, 10_000);
    assert.ok(alive(worker.child));
  });
});
