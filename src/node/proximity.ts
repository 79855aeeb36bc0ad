import type { Libp2p, Stream } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { DIAL_TIMEOUT_MS, PROBE_BYTES } from '../p2p/constants.ts';
import { encodeControl, encodeTensor } from '../p2p/frames.ts';
import { receiveFrames, sendParts } from '../p2p/stream.ts';
import type { TensorLinkNode } from '../p2p/node.ts';

/** Round-trip time and bandwidth from this node to one peer, as last measured. */
export interface Proximity {
  rttMs: number;
  mbps: number;
  measuredAt: number;
}

export const PROBE_PROTOCOL = '/tensorlink/probe/1.0.0';

/** Answers bandwidth probes: a tensor frame of PROBE_BYTES comes in, one small frame goes back. */
export async function serveProbes(node: Libp2p): Promise<void> {
  await node.handle(PROBE_PROTOCOL, (stream: Stream) => {
    receiveFrames(stream, (frame) => {
      stream.send(encodeControl(frame.kind === 'tensor' ? { ok: true, bytes: frame.tensor.bytes.length } : { ok: true }));
    });
  });
}

/**
 * Measures, on one open stream, the round trip of a small message (the best of five) and
 * the bandwidth of one PROBE_BYTES transfer to a peer.
 */
export async function probe(node: TensorLinkNode, addr: string): Promise<Proximity> {
  const stream = await node.dialProtocol(multiaddr(addr), PROBE_PROTOCOL, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
  try {
    let answer: () => void = () => {};
    receiveFrames(stream, () => answer());
    const reply = () =>
      new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('probe timed out')), DIAL_TIMEOUT_MS);
        answer = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    let rttMs = Number.POSITIVE_INFINITY;
    for (let i = 0; i < 5; i++) {
      const t = performance.now();
      const back = reply();
      stream.send(encodeControl({ probe: i }));
      await back;
      rttMs = Math.min(rttMs, performance.now() - t);
    }
    const t0 = performance.now();
    const done = reply();
    await sendParts(stream, encodeTensor({ requestId: 0, dtype: 'float32', shape: [PROBE_BYTES / 4], bytes: new Uint8Array(PROBE_BYTES) }));
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
