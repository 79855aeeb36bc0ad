import '../polyfills.ts';
import { networkInterfaces } from 'node:os';
import { gossipsub } from '@libp2p/gossipsub';
import { gossipScore } from './gossip-score.ts';
import { identify } from '@libp2p/identify';
import { kadDHT, passthroughMapper } from '@libp2p/kad-dht';
import { circuitRelayServer, circuitRelayTransport } from '@libp2p/circuit-relay-v2';
import type { Libp2p, PeerId, PrivateKey } from '@libp2p/interface';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { noise } from '@libp2p/noise';
import { ping } from '@libp2p/ping';
import { tcp } from '@libp2p/tcp';
import { yamux } from '@libp2p/yamux';
import { generateKeyPair } from '@libp2p/crypto/keys';
import { peerIdFromString } from '@libp2p/peer-id';
import { createLibp2p } from 'libp2p';
import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import { loadOrCreateIdentity } from './identity.ts';
import { PING_INTERVAL_MS, PING_STREAMS, PING_TIMEOUT_MS } from './constants.ts';
import { isPublicIPv4 } from './reach.ts';
import { meterRelay, type RelayGate, relayGater, remoteIp } from './relay-server.ts';
import { browserListen, browserTransports, dropDeadWebRTC, webRTCTransport } from './webrtc.ts';

export interface NodeOptions {
  /** Where the identity (and later other state) lives; omitted: a fresh identity per run. */
  dataDir?: string;
  /** Listen addresses (default: a free TCP port on 127.0.0.1). */
  listen?: string[];
  /**
   * Addresses to announce besides those of its own interfaces (`--announce`): what it cannot see itself, such as its
   * router's public address with a forwarded port. Announced at once, as its interfaces' are.
   */
  announce?: string[];
  /**
   * Addresses announced instead of its interfaces' (`--announce` adds to them): the only ones others are told, for a
   * node that must be reached through something in front of it (a reverse proxy, a port forward whose inside address
   * others must not use; the speculative bench puts a delay relay there).
   */
  advertise?: string[];
  /**
   * Serve circuit relay v2 (a validator): peers behind NAT reserve a slot and are reached through it. Reservations and
   * relayed connections carry no data or time limit, for the peers `gate` lets in; everyone else is refused.
   */
  relay?: RelayGate;
  /** Run the DHT as a client only (a node behind NAT: others cannot dial it to ask it anything). Default: server. */
  dhtClient?: boolean;
  /**
   * STUN servers for WebRTC's hole punching (`stun:HOST:PORT`: a validator's, see `stunServerOf`). None: a WebRTC
   * connection offers only this machine's own addresses (enough when one side is on the internet). Never a public
   * STUN server nobody chose.
   */
  stun?: string[];
  /**
   * Listen for browsers beside TCP (a validator, a worker of the CLI): WebRTC-direct on a free UDP port of the TCP
   * listen address's interface, and with `websockets` a WebSocket port there too (a browser tab dials these: it cannot
   * open TCP). The ready line lists them after the TCP addresses.
   */
  browsers?: { websockets: boolean };
}

/** TensorLink's own DHT: peers of the public libp2p DHT are not ours to query. */
export const DHT_PROTOCOL = '/tensorlink/kad/1.0.0';
/** Inbound connections a node takes from one address per second (libp2p's default: 5). */
export const INBOUND_CONNECTIONS_PER_SECOND = 64;

export type TensorLinkNode = Libp2p<{
  identify: ReturnType<ReturnType<typeof identify>>;
  ping: ReturnType<ReturnType<typeof ping>>;
  dht: ReturnType<ReturnType<typeof kadDHT>>;
  pubsub: ReturnType<ReturnType<typeof gossipsub>>;
}>;

/**
 * A libp2p node with TensorLink's stack: TCP, noise encryption, yamux multiplexing,
 * identify, ping, a Kademlia DHT (server mode, private addresses kept) and gossipsub.
 */
export async function createNode(options: NodeOptions = {}): Promise<TensorLinkNode> {
  const privateKey: PrivateKey = options.dataDir ? await loadOrCreateIdentity(options.dataDir) : await generateKeyPair('Ed25519');
  const listen = options.listen ?? ['/ip4/127.0.0.1/tcp/0'];
  // the transports are factories: the same ones serve each try below
  const forBrowsers = await browserTransports(options.browsers);
  // a peer's address as a relay sees it: its direct connection's (the node is not built yet when the gater is made)
  let built: Libp2p | null = null;
  const ipOf = (peer: PeerId): string | null => {
    for (const c of built?.getConnections(peer) ?? []) if (c.status === 'open' && remoteIp(c) !== null) return remoteIp(c);
    return null;
  };
  const start = async (browserAddrs: string[]) => createLibp2p({
    privateKey,
    addresses: {
      listen: [...listen, ...browserAddrs],
      appendAnnounce: options.announce ?? [],
      ...(options.advertise?.length ? { announce: options.advertise } : {}),
    },
    // circuit relay: any node dials a peer behind NAT through its relay; a peer behind NAT listens on its relay's /p2p-circuit
    // and on /webrtc, a direct connection signalled through the relay (see dial.ts)
    transports: [
      tcp(), circuitRelayTransport(), ...(await webRTCTransport(options.stun ?? [])),
      ...(browserAddrs.length > 0 ? forBrowsers : []),
    ],
    ...(options.relay ? { connectionGater: relayGater(options.relay, (peer) => ipOf(peer)) } : {}),
    // a peer busy with a long computation (a large section on the js backend, a loaded machine) answers no ping until
    // it is done: libp2p's default 5 s would abort its connections, and with them every job on them
    connectionMonitor: { pingInterval: PING_INTERVAL_MS, pingTimeout: { minTimeout: PING_TIMEOUT_MS, maxTimeout: PING_TIMEOUT_MS } },
    // many peers share one address (a gateway's users, a swarm on one machine, a home behind one NAT): libp2p's default
    // of 5 inbound connections a second from one address refuses the sixth user of a host; a burst per second stays bounded
    connectionManager: { inboundConnectionThreshold: INBOUND_CONNECTIONS_PER_SECOND },
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: {
      identify: identify(),
      // pings overlap while a peer is busy (one every PING_INTERVAL_MS, each waiting PING_TIMEOUT_MS): room for all of them
      ping: ping({ maxOutboundStreams: PING_STREAMS, maxInboundStreams: PING_STREAMS }),
      // Loopback and LAN addresses are what a local or home swarm has: keep them (the default drops them).
      dht: kadDHT({ protocol: DHT_PROTOCOL, clientMode: options.dhtClient === true, peerInfoMapper: passthroughMapper }),
      // A worker alone with its validator still publishes (the validator may not be in its mesh yet).
      pubsub: gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: false, ...gossipScore() }),
      // libp2p's limits are one size for every pair (its defaults, 128 KiB and 2 minutes a connection, would cut a job's
      // traffic): the gate's meter (relay-server.ts) limits each pair as its work needs instead
      ...(options.relay ? { relay: circuitRelayServer({ reservations: UNLIMITED_RESERVATIONS }) } : {}),
    },
  });
  // WebRTC-direct's UDP port is picked free just before libdatachannel binds it: another process may take it in between
  // (many nodes starting at once on one machine), so a node tries a few ports, then starts without browser transports
  let node: Awaited<ReturnType<typeof start>> | null = null;
  for (let attempt = 0; node === null; attempt++) {
    const browserAddrs = forBrowsers.length > 0 && attempt < BROWSER_PORT_TRIES ? await browserListen(listen, options.browsers) : [];
    try {
      node = await start(browserAddrs);
    } catch (err) {
      if (browserAddrs.length === 0) throw err;
      if (attempt === BROWSER_PORT_TRIES - 1) process.emitWarning(`browsers cannot reach this node: ${(err as Error).message}`);
    }
  }
  identities.set(node, privateKey);
  built = node;
  if (options.relay) {
    const stop = meterRelay((node.services as Record<string, unknown>).relay, options.relay);
    node.addEventListener('stop', stop, { once: true });
  }
  announceOwnAddresses(node);
  dropDeadWebRTC(node);
  return node as unknown as TensorLinkNode;
}

/** Ports a node tries for WebRTC-direct before it starts without browser transports. */
const BROWSER_PORT_TRIES = 3;

/** Peers behind NAT a relay (a validator) holds slots for at once. */
export const MAX_RELAY_RESERVATIONS = 1024;
/** A relay's slots: no limit libp2p applies (and tells both ends of); the gate's meter limits each pair. */
const UNLIMITED_RESERVATIONS = { applyDefaultLimit: false, maxReservations: MAX_RELAY_RESERVATIONS };

/** What a node's addresses are confirmed for: as long as it runs (they are facts about its own interfaces). */
const OWN_ADDRESS_TTL_MS = 100 * 365 * 24 * 3600 * 1000;

/**
 * Announces the node's own interfaces' public-range addresses at once. libp2p 3 holds a listener's public addresses
 * back until AutoNAT has verified them, and nothing verifies them in a swarm without AutoNAT peers (a validator on a
 * public address listed only 127.0.0.1); private ones it announces at once. An address of one of its own interfaces,
 * public or not, is a fact about its machine, not a guess: each is confirmed as a transport address when it listens.
 */
function announceOwnAddresses(node: Libp2p): void {
  const manager = (node as unknown as { components?: { addressManager?: OwnAddresses } }).components?.addressManager;
  if (!manager?.getAddressesWithMetadata || !manager.confirmObservedAddr) return;
  for (const a of manager.getAddressesWithMetadata()) {
    if (a.type === 'transport' && !a.verified) manager.confirmObservedAddr(a.multiaddr, { type: 'transport', ttl: OWN_ADDRESS_TTL_MS });
  }
}

/** The part of libp2p's address manager this module uses. */
interface OwnAddresses {
  getAddressesWithMetadata(): { multiaddr: Multiaddr; verified: boolean; type: string }[];
  confirmObservedAddr(addr: Multiaddr, options: { type: 'transport'; ttl: number }): void;
}

const identities = new WeakMap<object, PrivateKey>();

/**
 * The node's signer for records: its peer id and the 32-byte seed of its Ed25519 identity
 * key (the key libp2p authenticates its connections with), so that a record's signature is
 * checked against nothing but the peer id.
 */
export function signerOf(node: object): { peer: string; seed: Uint8Array } {
  const key = identities.get(node);
  if (!key || key.type !== 'Ed25519') throw new InvalidArgumentError('this node was not made by createNode: it has no Ed25519 identity to sign with');
  return { peer: (node as { peerId: { toString(): string } }).peerId.toString(), seed: key.raw.subarray(0, 32) };
}

/** The raw 32-byte Ed25519 public key a peer id embeds (a typed error for other ids). */
export function publicKeyOf(peer: string): Uint8Array {
  let key;
  try {
    key = peerIdFromString(peer).publicKey;
  } catch (cause) {
    throw new InvalidMessageError(`'${peer.slice(0, 80)}' is not a peer id`, { cause });
  }
  if (!key || key.type !== 'Ed25519') throw new InvalidMessageError(`${peer} has no Ed25519 key in its id`);
  return key.raw;
}

/**
 * The relay slot a node behind NAT listens on: `<bootstrap>/p2p-circuit` when the validator it joins is at a public
 * IPv4 address and none of this machine's interfaces has one (it sits behind a router: nobody outside can dial it);
 * null otherwise (a swarm on one machine or a LAN, a machine with a public address, or one that said --announce).
 */
export function relayListen(bootstrap: string, interfaces: string[] = ownIPv4()): string | null {
  const host = /^\/ip4\/([\d.]+)\/tcp\/\d+\/p2p\/\w+$/.exec(bootstrap)?.[1];
  if (!host || !isPublicIPv4(host) || interfaces.some(isPublicIPv4)) return null;
  return `${bootstrap}/p2p-circuit`;
}

/** This machine's IPv4 addresses. */
function ownIPv4(): string[] {
  return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).filter((i) => i.family === 'IPv4').map((i) => i.address));
}

/** Starts listening on one more address once the node runs (a relay slot, taken when the relay knows it). */
export async function listenAlso(node: Libp2p, addr: string): Promise<void> {
  type Transports = { listen(addrs: Multiaddr[]): Promise<void> };
  const manager = (node as unknown as { components: { transportManager: Transports } }).components.transportManager;
  await manager.listen([multiaddr(addr)]);
}
