import type { Libp2p, Stream } from '@libp2p/interface';
import { PeerUnreachableError, RateLimitedError } from '../../../errors.ts';
import { MAX_CONTROL_FRAME_BYTES } from '../../constants.ts';
import { PeerRateLimiter } from '../../rate-limit.ts';
import { type DialTarget, dialProtocol } from '../../dial.ts';
import { pathTo } from '../../webrtc.ts';
import { encodeControl, encodeTensor } from '../../frames.ts';
import { receiveFrames, sendMessage, sendQuietly } from '../../stream.ts';
import type { Proximity } from '../../vocabulary.ts';
import { BANDWIDTH_PROBES_PER_SECOND, MAX_PROBE_FRAME_BYTES, MAX_PROBE_STREAMS, PROBE_BYTES, PROBE_FRAMES_PER_SECOND, PROBE_PINGS, PROBE_PROTOCOL, PROBE_TIMEOUT_MS } from './constants.ts';
import { parseProbeAnswer } from './schema.ts';

/**
 * Answers probes: a small frame for each ping, and for a tensor frame of PROBE_BYTES (the bandwidth probe) one small
 * frame back. Each peer within its rates (PROBE_FRAMES_PER_SECOND, BANDWIDTH_PROBES_PER_SECOND): past them its stream
 * is reset, and a frame longer than a probe's is refused at its length.
 */
export async function serveProbes(node: Libp2p): Promise<void> {
  const frames = new PeerRateLimiter(PROBE_FRAMES_PER_SECOND);
  const bandwidth = new PeerRateLimiter(BANDWIDTH_PROBES_PER_SECOND);
  node.addEventListener('peer:disconnect', (evt) => {
    frames.forget(evt.detail.toString());
    bandwidth.forget(evt.detail.toString());
  });
  await node.handle(
    PROBE_PROTOCOL,
    (stream: Stream, connection) => {
      const from = connection.remotePeer.toString();
      // a prober closes its side when done: this side closes too, so the stream stops counting against the limit
      stream.addEventListener('remoteCloseWrite', () => void stream.close().catch(() => {}));
      receiveFrames(stream, (frame) => {
        if (!frames.allow(from) || (frame.kind === 'tensor' && !bandwidth.allow(from))) {
          stream.abort(new RateLimitedError(`more than ${BANDWIDTH_PROBES_PER_SECOND} probes a second`));
          return;
        }
        sendQuietly(stream, [encodeControl(frame.kind === 'tensor' ? { ok: true, bytes: frame.tensor.bytes.length } : { ok: true })]);
      }, undefined, MAX_PROBE_FRAME_BYTES);
    },
    { maxInboundStreams: MAX_PROBE_STREAMS },
  );
}

/** A probe stream: `ask` sends a frame list and waits for its answer (each within `left()`); `close` ends it. */
async function openProbe(node: Libp2p, target: DialTarget, timeoutMs: number | undefined) {
  const deadline = performance.now() + (timeoutMs ?? Number.POSITIVE_INFINITY);
  const left = () => Math.max(0, Math.ceil(Math.min(PROBE_TIMEOUT_MS, deadline - performance.now())));
  const stream = await dialProtocol(node, target, PROBE_PROTOCOL, AbortSignal.timeout(left()));
  let answer: (m: unknown) => void = () => {};
  receiveFrames(stream, (frame) => answer(frame.kind === 'control' ? frame.message : null), undefined, MAX_CONTROL_FRAME_BYTES);
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
  return {
    left,
    async ask(frames: Uint8Array[]): Promise<void> {
      const back = reply();
      await sendMessage(stream, frames, { signal: AbortSignal.timeout(left()) });
      await back;
    },
    close: () => stream.close().catch(() => {}),
  };
}

/** The best of PROBE_PINGS round trips of a small message on an open probe stream, in ms. */
async function pings(p: Awaited<ReturnType<typeof openProbe>>): Promise<number> {
  let rttMs = Number.POSITIVE_INFINITY;
  for (let i = 0; i < PROBE_PINGS; i++) {
    const t = performance.now();
    await p.ask([encodeControl({ probe: i })]);
    rttMs = Math.min(rttMs, performance.now() - t);
  }
  return Math.round(rttMs * 1000) / 1000;
}

/**
 * The round trip of a small message to a peer (the best of PROBE_PINGS on one stream), in ms: a probe without its
 * bandwidth transfer. Past `timeoutMs`, PeerUnreachableError.
 */
export async function roundTrip(node: Libp2p, target: DialTarget, options: { timeoutMs?: number } = {}): Promise<number> {
  const p = await openProbe(node, target, options.timeoutMs);
  try {
    return await pings(p);
  } finally {
    await p.close();
  }
}

/**
 * Measures, on one open stream, the round trip of a small message (the best of PROBE_PINGS)
 * and the bandwidth of one PROBE_BYTES transfer to a peer. `timeoutMs` bounds the whole probe
 * (each answer waits at most PROBE_TIMEOUT_MS in any case); past it, PeerUnreachableError.
 * @example
 * const { rttMs, mbps } = await probe(node, { peerId, addrs }, { timeoutMs: 3000 })
 */
export async function probe(node: Libp2p, target: DialTarget, options: { timeoutMs?: number } = {}): Promise<Proximity> {
  const p = await openProbe(node, target, options.timeoutMs);
  try {
    const rttMs = await pings(p);
    const t0 = performance.now();
    await p.ask(encodeTensor({ requestId: 0, dtype: 'float32', shape: [PROBE_BYTES / 4], bytes: new Uint8Array(PROBE_BYTES) }));
    const seconds = (performance.now() - t0) / 1000;
    const via = 'peerId' in target ? pathTo(node, target.peerId) : null;
    return { rttMs, mbps: Math.round(((PROBE_BYTES * 8) / 1e6 / seconds) * 10) / 10, measuredAt: Date.now(), ...(via ? { via } : {}) };
  } finally {
    await p.close();
  }
}
