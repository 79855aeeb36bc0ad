/**
 * `npm run bench -- --only fuzz`: a million fuzzed frames on every protocol a stranger can reach (control on the validator
 * and on a worker, the stage protocol, probes, results, the peers' gossip), sent to a validator and a worker running as
 * their own processes (and to a user's result inbox in this one). Each frame is a well-formed one of the protocol,
 * mutated: a field of its JSON replaced by a value no schema takes, removed or added; bytes flipped; cut short; its
 * length prefix changed; a tensor of another dtype or shape; random bytes; or left whole. After each protocol, both
 * processes must be alive and answer, and the worker's owner-checked job must compute exactly as before. The figure is
 * fuzzed frames a second against well-formed frames a second on the same protocol, measured in the same run.
 * `FUZZ_PROTOCOLS=control,stage,probe,result,gossip` runs only those; `FUZZ_FRAMES=N` sends N frames a protocol.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Libp2p, Stream } from '@libp2p/interface';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { configToHF, createModel, gpt2Config } from '../src/models/index.ts';
import {
  AUDIT_REQUESTS, CONTROL_PROTOCOL, createNode, encodeControl, encodeTensor, INFERENCE_REQUESTS, LOAD_REQUESTS, MAX_MESSAGES_PER_SECOND,
  PROBE_PROTOCOL,
  parseStatsAnswer, request, RESULT_PROTOCOL, STAGE_PROTOCOL, type TensorLinkNode, TRAINING_REQUESTS,
} from '../src/p2p/index.ts';
import { sectionCopy, sectionWeights } from '../src/pipeline/index.ts';
import { Generator, noGrad, setBackend, tensor } from '../src/tensor/index.ts';
import { RemoteStage, ResultInbox, tensorSource } from '../src/user/index.ts';
import { concat } from '../test/helpers/bytes.ts';
import { alive, rss, type Running, startNode } from '../test/helpers/processes.ts';
import { runTsChild } from './child-json.ts';
import { type Corpus, floats, fuzzFrame, type Fuzzed } from './fuzz-frames.ts';
import type { GossipJob, GossipResult } from './fuzz-gossip-child.ts';
import type { Row } from './gemm.ts';

/**
 * Sends `count` frames from `make` to `addr` over `protocol`, from every identity at once, each within `perPeer` frames a
 * second (the receiver's rate limit: frames past it would only reset their streams unread), at most 200 on a stream; a
 * frame that breaks the framing is its stream's last (what would follow it is never read). `resets`: streams the
 * receiver reset before their frames were all written.
 */
async function flood(
  from: Libp2p[], addr: Multiaddr, protocol: string, count: number, make: (i: number) => Fuzzed, perPeer = Number.POSITIVE_INFINITY,
): Promise<{ frames: number; seconds: number; resets: number; streams: number }> {
  const started = performance.now();
  let next = 0;
  let resets = 0;
  let streams = 0;
  let lastProgress = performance.now();
  const one = async (node: Libp2p) => {
    let mine = 0;
    const began = performance.now();
    while (next < count) {
      // a receiver that refuses every stream for a minute is not being fuzzed any more: the run says so and stops
      if (performance.now() - lastProgress > 60_000) throw new Error(`${protocol}: no frame went in 60 s (${resets} streams reset early)`);
      let stream: Stream;
      try {
        stream = await node.dialProtocol(addr, protocol, { signal: AbortSignal.timeout(10_000) });
      } catch {
        resets++;
        await new Promise((r) => setTimeout(r, 100));
        continue;
      }
      streams++;
      // answers are read and dropped: a peer that never reads would only be reset for stalling
      stream.addEventListener('message', () => {});
      for (let k = 0; k < 200 && next < count; k++) {
        if (stream.status !== 'open') {
          resets++;
          // refused before a frame went (the receiver's stream limit): a moment before the next
          if (k === 0) await new Promise((r) => setTimeout(r, 50));
          break;
        }
        const ahead = (mine / perPeer) * 1000 - (performance.now() - began);
        if (ahead > 0) await new Promise((r) => setTimeout(r, ahead));
        const frame = make(next++);
        mine++;
        lastProgress = performance.now();
        try {
          if (!stream.send(frame.bytes)) await stream.onDrain({ signal: AbortSignal.timeout(10_000) });
        } catch {
          resets++;
          break;
        }
        if (frame.breaks) break;
      }
      // the stream's frames are read before it is let go (a close, not a reset, unless its framing broke); a receiver
      // that keeps its side open (a user's inbox) is given 2 s
      await stream.close({ signal: AbortSignal.timeout(2_000) }).catch(() => stream.abort(new Error('next batch')));
    }
  };
  // a long run says how far it is every 30 s
  const progress = setInterval(() => process.stderr.write(`    ${protocol}: ${next} of ${count} frames, ${streams} streams, ${resets} reset early\n`), 30_000);
  await Promise.all(from.map(one)).finally(() => clearInterval(progress));
  return { frames: Math.min(next, count), seconds: (performance.now() - started) / 1000, resets, streams };
}

/** CPU time a process has used (user and system), from /proc. */
function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

export async function benchFuzz(quick: boolean, log: (s: string) => void): Promise<Row[]> {
  setBackend('js');
  // FUZZ_FRAMES=N: N frames a protocol instead (a shorter run to look into one)
  const count = Number(process.env.FUZZ_FRAMES ?? 0) || (quick ? 20_000 : 1_000_000);
  const running: Running[] = [];
  const nodes: TensorLinkNode[] = [];
  const rows: Row[] = [];
  // the result inbox's waits are opened again as they end, until the run ends
  let open = true;
  try {
    const validator = await startNode(['validator', '--backend', 'js']);
    running.push(validator);
    const worker = await startNode(['worker', '--bootstrap', validator.addrs[0], '--backend', 'js', '--memory', '1GiB', '--max-requests', '1000000']);
    running.push(worker);
    const vAddr = multiaddr(validator.addrs[0]);
    const wAddr = multiaddr(worker.addrs[0]);
    // 64 identities: a control protocol answers 200 messages a second per peer (the rest are refused by its limiter), a
    // probe server 48 frames: more peers, more of the frames reach the handlers
    const fuzzers = await Promise.all(Array.from({ length: 64 }, () => createNode()));
    const [owner, user] = await Promise.all([createNode(), createNode()]);
    nodes.push(...fuzzers, owner, user);

    // the owner's job on the worker: checked exactly after every protocol
    const config = gpt2Config({ vocabSize: 50, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
    const model = createModel(config, { seed: 3 });
    const range: [number, number] = [1, 3];
    const stage = await RemoteStage.open(owner, wAddr, 'job-owner');
    await stage.load(configToHF(config), range, tensorSource(sectionWeights(model, range)));
    // and a second job of the owner's, the one its fuzzed stage frames drive (they may train it: the checked one stays)
    const fuzzJob = await RemoteStage.open(owner, wAddr, 'job-fuzz');
    await fuzzJob.load(configToHF(config), range, tensorSource(sectionWeights(model, range)));
    const x = noGrad(() => createModel(config, { section: [0, 1] }).forward(tensor([1, 2, 3], [1, 3], 'int32')));
    const positions = tensor([0, 1, 2], [1, 3], 'int32');
    const expected = noGrad(() => sectionCopy(model, range).forward(x, { positions })).data;
    let checks = 0;
    const stillServing = async (what: string) => {
      if (!alive(validator.child) || !alive(worker.child)) throw new Error(`fuzz ${what}: a process died`);
      await request(owner, vAddr, { type: 'status' }, 10_000);
      parseStatsAnswer(await request(owner, wAddr, { type: 'stats' }, 10_000));
      const out = await stage.forward(`check-${checks++}`, x, positions, null);
      if (out.data.some((v, i) => v !== expected[i])) throw new Error(`fuzz ${what}: the owner's job computes otherwise after it`);
    };

    // the user's inbox takes results from the stages it waits on: the fuzzers are named as such a chain. A wait ends when
    // a fuzzed frame answers it (an error, a tensor of its id) or a fuzzer disconnects (a chain's stage lost): each is
    // opened again at once, and the frames name the waits open now
    const inbox = await ResultInbox.start(user);
    const record = { kind: 'forward', job: 'j', step: 0, micro: 0, peer: owner.peerId.toString(), sig: 'AAAA', input: 'a'.repeat(64), output: 'b'.repeat(64) };
    const resultMessages: Record<string, unknown>[] = [];
    const wait = (i: number) => {
      const w = inbox.expect(new Set(fuzzers.map((f) => f.peerId.toString())), 3_600_000);
      resultMessages[i] = { type: 'records', id: w.requestId, records: [record] };
      w.result.catch(() => {}).finally(() => {
        if (open) wait(i);
      });
    };
    fuzzers.forEach((_, i) => wait(i));

    const announce = { type: 'announce', roles: ['worker'], addrs: ['/ip4/127.0.0.1/tcp/1'], proximity: {}, capabilities: null, at: Date.now() };
    const stageTypes = [...LOAD_REQUESTS, ...INFERENCE_REQUESTS, ...TRAINING_REQUESTS, ...AUDIT_REQUESTS, 'dispute-open', 'dispute-leaves', 'dispute-value', 'dispute-close'];
    const protocols: { name: string; addr: Multiaddr; protocol: string; corpus: Corpus; from: Libp2p[]; perPeer?: number }[] = [
      {
        name: 'control, validator', addr: vAddr, protocol: CONTROL_PROTOCOL, from: fuzzers, perPeer: MAX_MESSAGES_PER_SECOND, corpus: {
          tensors: [],
          messages: [
            announce, { type: 'status', page: 0 }, { type: 'models', page: 0 }, { type: 'overview' },
            { type: 'job-progress', jobId: 'j', step: 1, loss: 1 }, { type: 'audit', jobId: 'j', worker: { peerId: owner.peerId.toString(), addrs: [] }, config: {}, record },
            { type: 'dispute', jobId: 'j', a: { record }, b: { record } }, { type: 'ledger-submit', records: [record] }, { type: 'ledger-head' },
            { type: 'ledger-blocks', from: 0 }, { type: 'ledger-show' }, { type: 'ledger-proof', height: 0, id: 'x' }, { type: 'ledger-hello', addrs: [] },
            { type: 'ledger-propose', block: {} }, { type: 'ledger-commit', block: {} },
          ],
        },
      },
      {
        name: 'control, worker', addr: wAddr, protocol: CONTROL_PROTOCOL, from: fuzzers, perPeer: MAX_MESSAGES_PER_SECOND, corpus: {
          tensors: [],
          messages: [
            { type: 'capabilities' }, { type: 'stats' }, { type: 'proximity' }, { type: 'open-job', jobId: 'fuzz' }, { type: 'job-status', jobId: 'job-owner' },
            { type: 'close-job', jobId: 'job-owner' }, { type: 'ends-manifest', model: 'm', page: 0 }, { type: 'ends-chunk', model: 'm', hash: 'h', index: 0 },
            { type: 'ends-file', model: 'm', file: 'config.json', offset: 0 },
          ],
        },
      },
      {
        // from the job's owner too: its job's handlers see every mutation, and must still compute exactly after
        name: 'stage, worker', addr: wAddr, protocol: STAGE_PROTOCOL, from: [owner, ...fuzzers.slice(0, 3)], corpus: {
          tensors: [concat(floats([1, 3, 32])), concat(floats([2, 3])), concat(encodeTensor({ requestId: 0, dtype: 'int32', shape: [1, 3], bytes: new Uint8Array(12) }))],
          messages: stageTypes.map((type) => ({
            type, jobId: 'job-fuzz', tensors: type === 'forward' || type.startsWith('train-') ? 1 : 0, sessionId: 'fuzz', micro: 0, step: 0, name: 'h.1.mlp.c_fc.weight',
            key: 'k', index: 0, lr: 1e-3, scale: 1, peers: [], names: [], kind: 'forward', part: 'input', length: 1,
          })),
        },
      },
      {
        // within a probe server's rates: 48 frames a second per peer, 4 of them bandwidth probes
        name: 'probe, worker', addr: wAddr, protocol: PROBE_PROTOCOL, from: fuzzers, perPeer: 24, corpus: {
          tensors: [concat(floats([1024]))],
          messages: [{ probe: 0 }, { probe: 1 }],
        },
      },
      {
        name: 'result, user', addr: user.getMultiaddrs()[0], protocol: RESULT_PROTOCOL, from: fuzzers, corpus: {
          // records only: an error or a tensor for a waiting id would end that wait, and a stream from a peer no request
          // waits on is reset at once
          tensors: [],
          messages: resultMessages,
        },
      },
    ];

    // FUZZ_PROTOCOLS=probe,result: only those (by the first word of their names)
    const only = process.env.FUZZ_PROTOCOLS?.split(',');
    for (const p of protocols.filter((q) => !only || only.includes(q.name.split(',')[0]))) {
      const rng = new Generator(7);
      const before = { validator: rss(validator.child.pid!), worker: rss(worker.child.pid!) };
      // the reference: well-formed frames of the same protocol, a tenth as many
      const validRng = new Generator(8);
      const reference = await flood(p.from, p.addr, p.protocol, Math.ceil(count / 10), (i) => {
        const all = [...p.corpus.messages.map((m) => encodeControl({ ...m, id: i })), ...p.corpus.tensors];
        return { bytes: all[validRng.int(all.length)], breaks: false };
      }, p.perPeer);
      const fuzzed = await flood(p.from, p.addr, p.protocol, count, (i) => fuzzFrame(p.corpus, rng, i), p.perPeer);
      await stillServing(p.name);
      const after = { validator: rss(validator.child.pid!), worker: rss(worker.child.pid!) };
      const rate = fuzzed.frames / fuzzed.seconds;
      const refRate = reference.frames / reference.seconds;
      log(`  ${p.name}: ${fuzzed.frames} fuzzed frames in ${fuzzed.seconds.toFixed(1)} s (${Math.round(rate)}/s, ${fuzzed.streams} streams, ${fuzzed.resets} reset early), `
        + `well-formed ${Math.round(refRate)}/s; still serving; RSS validator ${(before.validator / 2 ** 20).toFixed(0)} → ${(after.validator / 2 ** 20).toFixed(0)} MiB, `
        + `worker ${(before.worker / 2 ** 20).toFixed(0)} → ${(after.worker / 2 ** 20).toFixed(0)} MiB`);
      rows.push({
        section: 'fuzz', case: `${p.name}: ${fuzzed.frames} fuzzed frames, no crash, still serving`, value: rate, unit: 'frames/s',
        reference: 'well-formed frames/s', referenceValue: refRate, ratio: rate / refRate,
      });
    }

    if (only && !only.includes('gossip')) return rows;
    // gossip: fuzzed announcements published on the peers' topic by a flooder in its own process (signed by it, as
    // every gossip message is); the figure is the validator's CPU time it cost
    const cpuBefore = cpuSeconds(validator.child.pid!);
    const before = rss(validator.child.pid!);
    const script = fileURLToPath(new URL('./fuzz-gossip-child.ts', import.meta.url));
    const g = await runTsChild<GossipResult>(script, { validator: validator.addrs[0], count, seed: 9 } satisfies GossipJob, 'the gossip flooder');
    const cpu = cpuSeconds(validator.child.pid!) - cpuBefore;
    await stillServing('gossip');
    log(`  gossip, validator: ${g.published} fuzzed announcements in ${g.seconds.toFixed(1)} s (${Math.round(g.published / g.seconds)}/s, hung up on and back ${g.redials} times) cost the validator `
      + `${cpu.toFixed(1)} s of CPU (${((cpu / g.seconds) * 100).toFixed(0)}% of a core while it lasted); still serving; RSS validator `
      + `${(before / 2 ** 20).toFixed(0)} → ${(rss(validator.child.pid!) / 2 ** 20).toFixed(0)} MiB`);
    rows.push({
      section: 'fuzz', case: `gossip, validator: ${g.published} fuzzed announcements, no crash, still serving; the validator's CPU share`,
      value: cpu / g.seconds, unit: 'cores', reference: 'the flood\'s own time', referenceValue: 1, ratio: cpu / g.seconds,
    });
  } finally {
    open = false;
    for (const r of running) if (alive(r.child)) r.child.kill('SIGKILL');
    await Promise.all(nodes.map((n) => Promise.resolve(n.stop()).catch(() => {})));
  }
  return rows;
}
