import type { Libp2p, Stream } from '@libp2p/interface';
import { peerIdFromString } from '@libp2p/peer-id';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { PeerUnreachableError } from '../errors.ts';
import { DIAL_TIMEOUT_MS } from './constants.ts';
import { connectDirectly, isWebRTC } from './webrtc.ts';
import type { PeerTarget } from './vocabulary.ts';
import { Validators } from './validators.ts';

/** The code of the /p2p/ component of a multiaddr. */
const P2P = 421;

/**
 * Every address of a peer as a dialable multiaddr ending in its /p2p/ id. libp2p's dialer
 * takes the whole list, ranks it (public before private, loopback last) and tries each in
 * turn: a worker listening on 0.0.0.0 announces 127.0.0.1 first, which is the dialer's own
 * machine on any other host, and its routable address next. Addresses that do not parse, or
 * that name another peer, are left out.
 */
export function dialAddrs(target: PeerTarget): Multiaddr[] {
  const out: Multiaddr[] = [];
  for (const raw of target.addrs) {
    let ma: Multiaddr;
    try {
      ma = multiaddr(raw);
    } catch {
      continue;
    }
    // the last /p2p/ names the peer (a relayed address names its relay first: /p2p/RELAY/p2p-circuit/p2p/PEER)
    const named = ma.getComponents().findLast((c) => c.code === P2P)?.value;
    if (named !== undefined && named !== target.peerId) continue;
    out.push(named === undefined ? ma.encapsulate(`/p2p/${target.peerId}`) : ma);
  }
  return out;
}

/**
 * A peer to dial: its id and addresses, or one multiaddr (with /p2p/, as `--bootstrap` takes), or a set of validators
 * (a stream goes to the current one; a control request moves on to the next when it cannot be reached).
 */
export type DialTarget = PeerTarget | Multiaddr | Validators;

/** How a target is named in messages and keys: its peer id, or its multiaddr (a set of validators: its current one's). */
export function targetName(target: DialTarget): string {
  if (target instanceof Validators) return target.current.toString();
  return 'peerId' in target ? target.peerId : target.toString();
}

/**
 * Attempts at opening a stream before a peer is taken for unreachable, the waits between them (each twice the last),
 * all within DIAL_TIMEOUT_MS: a connection that closes as a stream opens on it (two peers dialling each other at once,
 * one of them closing the duplicate; a WebRTC channel a loaded browser tab aborts) is not a lost peer.
 */
export const DIAL_ATTEMPTS = 3;
const DIAL_RETRY_MS = 250;
/** Errors another attempt would meet again: the peer does not speak the protocol, or the id is not one. */
const PERMANENT = new Set(['UnsupportedProtocolError', 'InvalidPeerIdError', 'InvalidMultiaddrError']);

/** Waits `ms`, or until `signal` aborts. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * Opens a stream of `protocol` to a peer, trying each of its addresses, up to DIAL_ATTEMPTS times;
 * PeerUnreachableError names the peer and why. A target with no addresses is dialed by its id alone: an open
 * connection (a job's owner, who dialed this worker) or what identify told the peer store.
 */
export async function dialProtocol(node: Libp2p, target: DialTarget, protocol: string, signal?: AbortSignal): Promise<Stream> {
  if (target instanceof Validators) return dialProtocol(node, target.current, protocol, signal);
  const all = 'peerId' in target ? dialAddrs(target) : [target];
  const deadline = AbortSignal.timeout(DIAL_TIMEOUT_MS);
  // a peer behind NAT: a direct WebRTC connection first (signalled through its relay), its other addresses (the relay) after
  const viaWebRTC = 'peerId' in target ? all.filter(isWebRTC) : [];
  const addrs = all.filter((a) => !viaWebRTC.includes(a));
  const within = signal ? AbortSignal.any([signal, deadline]) : deadline;
  for (let attempt = 1; ; attempt++) {
    if ('peerId' in target && viaWebRTC.length > 0) await connectDirectly(node, target.peerId, viaWebRTC, within);
    try {
      const to = addrs.length === 0 ? peerIdFromString((target as PeerTarget).peerId) : addrs.length === 1 ? addrs[0] : addrs;
      return await node.dialProtocol(to, protocol, { signal: within });
    } catch (cause) {
      if (attempt < DIAL_ATTEMPTS && !within.aborted && !PERMANENT.has((cause as Error)?.name)) {
        await pause(DIAL_RETRY_MS * 2 ** (attempt - 1), within);
        if (!within.aborted) continue;
      }
      const why = causeText(cause);
      throw new PeerUnreachableError(`cannot reach ${targetName(target)}${addrs.length > 1 ? ` at any of ${addrs.length} addresses` : ''}: ${why}`, { cause });
    }
  }
}

/** What went wrong, in words: an error's message (or name), each of an AggregateError's, or the thrown value itself. */
function causeText(cause: unknown): string {
  if (cause instanceof AggregateError && cause.errors.length > 0) return cause.errors.map(causeText).join('; ');
  if (cause instanceof Error) return cause.message || cause.name;
  return String(cause);
}
