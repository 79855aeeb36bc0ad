import type { Libp2p, Stream } from '@libp2p/interface';
import { PeerUnreachableError } from '../../../errors.ts';
import { type DialTarget, dialProtocol } from '../../dial.ts';
import { encodeControl, encodeTensor } from '../../frames.ts';
import { receiveFrames, sendMessage, sendQuietly } from '../../stream.ts';
import type { Proximity } from '../../vocabulary.ts';
import { MAX_PROBE_STREAMS, PROBE_BYTES, PROBE_PINGS, PROBE_PROTOCOL, PROBE_TIMEOUT_MS } from './constants.ts';
import { parseProbeAnswer } from './schema.ts';

/** Answers bandwidth probes: a tensor frame of PROBE_BYTES comes in, one small frame goes back. */
export async function serveProbes(node: Libp2p): Promise<void> {
  await node.handle(
    PROBE_PROTOCOL,
    (stream: Stream) => {
      receiveFrames(stream, (frame) => {
        sendQuietly(stream, [encodeControl(frame.kind === 'tensor' ? { ok: true, bytes: frame.tensor.bytes.length } : { ok: true })]);
      });
    },
    { maxInboundStreams: MAX_PROBE_STREAMS },
  );
}

/**
 * Measures, on one open stream, the round trip of a small message (the best of PROBE_PINGS)
 * and the bandwidth of one PROBE_BYTES transfer to a peer. `timeoutMs` bounds the whole probe
 * (each answer waits at most PROBE_TIMEOUT_MS in any case); past it, PeerUnreachableError.
 * @example
 * const { rttMs, mbps } = await probe(node, { peerId, addrs }, { timeoutMs: 3000 })
 */
export async function probe(node: Libp2p, target: DialTarget, options: { timeoutMs?: number } = {}): Promise<Proximity> {
  const deadline = performance.now() + (options.timeoutMs ?? Number.POSITIVE_INFINITY);
  const left = () => Math.max(0, Math.min(PROBE_TIMEOUT_MS, deadline - performance.now()));
  const stream = await dialProtocol(node, target, PROBE_PROTOCOL, AbortSignal.timeout(left()));
  try {
    let answer: (m: unknown) => void = () => {};
    receiveFrames(stream, (frame) => answer(frame.kind === 'control' ? frame.message : null));
    const reply = () => {
      const p = new Promise<void>((resolve, reject) => {
        const wait = left();
        const timer = setTimeout(() => reject(new PeerUnreachableError(`no probe answer within ${Math.round(wait)} ms`)), wait);
        answer = (m) => {
          clearTimeout(timer);
          try {
            parseProbeAnswer(m);
            resolve();
          } catch (err) {
            reject(err as Error);
          }
        };
      });
      p.catch(() => {}); // awaited below; a timeout while the send is still under way must not go unhandled
      return p;
    };
    let rttMs = Number.POSITIVE_INFINITY;
    for (let i = 0; i < PROBE_PINGS; i++) {
      const t = performance.now();
      const back = reply();
      await sendMessage(stream, [encodeControl({ probe: i })]);
      await back;
      rttMs = Math.min(rttMs, performance.now() - t);
    }
    const t0 = performance.now();
    const done = reply();
    const payload = encodeTensor({ requestId: 0, dtype: 'float32', shape: [PROBE_BYTES / 4], bytes: new Uint8Array(PROBE_BYTES) });
    await sendMessage(stream, payload, { signal: AbortSignal.timeout(left()) });
    await done;
    const seconds = (performance.now() - t0) / 1000;
    return {
      rttMs: Math.round(rttMs * 1000) / 1000,
      mbps: Math.round(((PROBE_BYTES * 8) / 1e6 / seconds) * 10) / 10,
      measuredAt: Date.now(),
    };
  } finally {
    await stream.close().catch(() => {});
  }
}
