import { createSocket } from 'node:dgram';
import type { Libp2p } from '@libp2p/interface';
import { peerIdFromString } from '@libp2p/peer-id';
import type { Multiaddr } from '@multiformats/multiaddr';
import type { PathKind } from './vocabulary.ts';

/**
 * Direct connections between peers behind NAT: WebRTC (libp2p's private-to-private transport), signalled over a relayed
 * connection through a validator, its holes punched with the validator's STUN (stun.ts). The relay carries a peer's
 * traffic only where WebRTC cannot get through (a symmetric NAT on the way).
 */

/** A peer's address for WebRTC, signalled through a relay: `…/p2p-circuit/webrtc/p2p/PEER`. */
export function isWebRTC(ma: Multiaddr): boolean {
  return ma.getComponents().some((c) => c.name === 'webrtc');
}

/** How long a WebRTC connection may take to come up before the relay carries the peer's traffic instead. */
export const WEBRTC_DIAL_MS = 5_000;
/** After a WebRTC connection to a peer failed (a symmetric NAT on the way), its traffic takes the relay this long. */
export const WEBRTC_RETRY_MS = 10 * 60_000;

const webrtcFailedAt = new WeakMap<Libp2p, Map<string, number>>();
const webrtcPending = new WeakMap<Libp2p, Map<string, Promise<void>>>();

/**
 * Opens a direct WebRTC connection to `peer` unless one direct connection (WebRTC or TCP) is open already; the streams
 * opened next take it (libp2p prefers a direct connection to a relayed one). One attempt at a time per peer, each of
 * WEBRTC_DIAL_MS; a failed one is not tried again for WEBRTC_RETRY_MS, and the dial goes on over the relay. Returns when
 * the attempt ends or `signal` aborts.
 */
export async function connectDirectly(node: Libp2p, peer: string, addrs: Multiaddr[], signal: AbortSignal): Promise<void> {
  const id = peerIdFromString(peer);
  if (node.getConnections(id).some((c) => c.status === 'open' && c.direct)) return;
  const failed = webrtcFailedAt.get(node) ?? new Map<string, number>();
  webrtcFailedAt.set(node, failed);
  if (Date.now() - (failed.get(peer) ?? -Infinity) < WEBRTC_RETRY_MS) return;
  const pending = webrtcPending.get(node) ?? new Map<string, Promise<void>>();
  webrtcPending.set(node, pending);
  let attempt = pending.get(peer);
  if (!attempt) {
    // the attempt runs on its own clock, whoever waits for it: a caller that gives up early does not cut it short
    attempt = node.dial(addrs.length === 1 ? addrs[0] : addrs, { signal: AbortSignal.timeout(WEBRTC_DIAL_MS) }).then(
      () => {
        failed.delete(peer);
      },
      () => {
        failed.set(peer, Date.now());
      },
    ).finally(() => pending.delete(peer));
    pending.set(peer, attempt);
  }
  if (signal.aborted) return;
  await new Promise<void>((resolve) => {
    const done = () => {
      signal.removeEventListener('abort', done);
      resolve();
    };
    signal.addEventListener('abort', done);
    void attempt.then(done);
  });
}

/** The path streams to `peer` take now: libp2p opens them on a direct connection where one is open, else on a relayed one. */
export function pathTo(node: Libp2p, peer: string): PathKind | null {
  const open = node.getConnections(peerIdFromString(peer)).filter((c) => c.status === 'open' && c.limits == null);
  const direct = open.find((c) => c.direct);
  if (direct) return isWebRTC(direct.remoteAddr) ? 'webrtc' : 'direct';
  return open.length > 0 ? 'relayed' : null;
}

/** The ping protocol every node of ours serves (libp2p's): opening a stream of it shows a connection carries data. */
const PING_PROTOCOL = '/ipfs/ping/1.0.0';

/**
 * libp2p's WebRTC transport, its ICE servers `stun`; none where its native part (node-datachannel's prebuilt binary)
 * does not load on this machine: relayed connections then stay relayed.
 */
export async function webRTCTransport(stun: string[]) {
  try {
    const { webRTC } = await import('@libp2p/webrtc');
    return [webRTC({ rtcConfiguration: () => ({ iceServers: stun.map((urls) => ({ urls })) }) })];
  } catch (err) {
    process.emitWarning(`WebRTC is not available on this machine (${(err as Error).message}): peers behind NAT are reached through relays only`);
    return [];
  }
}

/**
 * Closes WebRTC connections that never carry data. When the dialing side gives up before ICE got through, libp2p's
 * answering side still takes the connection as made (it reads the signalling stream's end as success): a "direct"
 * connection whose channels never open, which libp2p would then prefer to the relayed one for every new stream. A
 * stream opened on each new WebRTC connection within WEBRTC_DIAL_MS shows it works; otherwise it is closed.
 */
export function dropDeadWebRTC(node: Libp2p): void {
  node.addEventListener('connection:open', (evt) => {
    const conn = evt.detail;
    if (!isWebRTC(conn.remoteAddr)) return;
    conn.newStream(PING_PROTOCOL, { signal: AbortSignal.timeout(WEBRTC_DIAL_MS) }).then(
      (stream) => stream.close().catch(() => {}),
      (err: Error) => {
        // a protocol the other side does not speak still came over an open channel
        if (err.name === 'UnsupportedProtocolError' || conn.status !== 'open') return;
        conn.abort(err);
      },
    );
  });
}

/**
 * The transports a browser tab reaches a Node peer by: WebRTC-direct (a UDP port; the tab checks the peer's certificate
 * by the hash in its address) and, with `websockets`, WebSockets; none where they do not load.
 */
export async function browserTransports(browsers: { websockets: boolean } | undefined) {
  if (!browsers) return [];
  try {
    const { webRTCDirect } = await import('@libp2p/webrtc');
    const ws = browsers.websockets ? [(await import('@libp2p/websockets')).webSockets()] : [];
    return [webRTCDirect(), ...ws];
  } catch (err) {
    process.emitWarning(`browsers cannot reach this node (${(err as Error).message}): WebRTC-direct did not load`);
    return [];
  }
}

/**
 * Where browsers are listened for: WebRTC-direct (and WebSockets) on the interface of the first TCP listen address,
 * WebRTC-direct on a UDP port found free now (libdatachannel binds no port 0, and @libp2p/webrtc's own choice checks
 * TCP ports).
 */
export async function browserListen(listen: string[], browsers: { websockets: boolean } | undefined): Promise<string[]> {
  if (!browsers) return [];
  const host = listen.map((a) => /^\/ip4\/([\d.]+)\/tcp\//.exec(a)?.[1]).find((h) => h !== undefined) ?? '127.0.0.1';
  return [`/ip4/${host}/udp/${await freeUdpPort(host)}/webrtc-direct`, ...(browsers.websockets ? [`/ip4/${host}/tcp/0/ws`] : [])];
}

/** A UDP port of `host` that nothing holds now. */
function freeUdpPort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    socket.once('error', reject);
    socket.bind(0, host, () => {
      const { port } = socket.address();
      socket.close(() => resolve(port));
    });
  });
}
