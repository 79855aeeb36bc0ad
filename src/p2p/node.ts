import '../polyfills.ts';
import { gossipsub } from '@libp2p/gossipsub';
import { identify } from '@libp2p/identify';
import { kadDHT, passthroughMapper } from '@libp2p/kad-dht';
import type { Libp2p, PrivateKey } from '@libp2p/interface';
import type { Multiaddr } from '@multiformats/multiaddr';
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
  const node = await createLibp2p({
    privateKey,
    addresses: { listen: options.listen ?? ['/ip4/127.0.0.1/tcp/0'], appendAnnounce: options.announce ?? [] },
    transports: [tcp()],
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
      dht: kadDHT({ protocol: DHT_PROTOCOL, clientMode: false, peerInfoMapper: passthroughMapper }),
      // A worker alone with its validator still publishes (the validator may not be in its mesh yet).
      pubsub: gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: false }),
    },
  });
  identities.set(node, privateKey);
  announceOwnAddresses(node);
  return node as unknown as TensorLinkNode;
}

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
