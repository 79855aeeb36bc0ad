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
      if (frame.kind === 'tensor') stream.send(encodeControl({ ok: true, bytes: frame.tensor.bytes.length }));
    });
  });
}

/** Measures round trip (libp2p ping) and bandwidth (one PROBE_BYTES transfer) to a peer. */
export async function probe(node: TensorLinkNode, addr: string): Promise<Proximity> {
  const target = multiaddr(addr);
  const rttMs = await node.services.ping.ping(target, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
  const stream = await node.dialProtocol(target, PROBE_PROTOCOL, { signal: AbortSignal.timeout(DIAL_TIMEOUT_MS) });
  try {
    const answered = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('probe timed out')), DIAL_TIMEOUT_MS);
      receiveFrames(stream, () => {
        clearTimeout(timer);
        resolve();
      });
    });
    const t0 = performance.now();
    await sendParts(stream, encodeTensor({ requestId: 0, dtype: 'float32', shape: [PROBE_BYTES / 4], bytes: new Uint8Array(PROBE_BYTES) }));
    await answered;
    const seconds = (performance.now() - t0) / 1000;
    return { rttMs, mbps: Math.round(((PROBE_BYTES * 8) / 1e6 / seconds) * 10) / 10, measuredAt: Date.now() };
  } finally {
    await stream.close().catch(() => {});
  }
}
