import type { PeerId } from '@libp2p/interface';
import { InvalidMessageError } from '../errors.ts';
import { createNode, PEERS_TOPIC, type TensorLinkNode } from '../p2p/node.ts';
import { serveControl } from './control.ts';
import { createLogger, type Logger } from './log.ts';
import { type PeerRecord, parseAddrs, parseCapabilities, parseProximity, parseRoles } from './vocabulary.ts';

/** A worker that has not announced itself for this long is dropped from the registry (it refreshes every 2 s). */
export const PEER_TTL_MS = 10_000;

export interface Validator {
  node: TensorLinkNode;
  /** The live peers, the validator first. */
  peers(): PeerRecord[];
  stop(): Promise<void>;
}

/**
 * The validator: bootstrap peer and DHT server, keeper of the registry of workers (fed
 * by their announcements), answering `status` with the swarm's state.
 */
export async function startValidator(options: { dataDir?: string; listen?: string[]; log?: Logger } = {}): Promise<Validator> {
  const node = await createNode(options);
  const log = options.log ?? createLogger({ level: 'silent' });
  const registry = new Map<string, PeerRecord>();
  const started = Date.now();
  const peers = (): PeerRecord[] => {
    const now = Date.now();
    for (const [id, r] of registry) {
      if (now - r.lastSeen > PEER_TTL_MS) {
        registry.delete(id);
        log.info('peer-dropped', { remote: id, silentMs: now - r.lastSeen });
      }
    }
    const self: PeerRecord = {
      peerId: node.peerId.toString(),
      roles: ['validator'],
      capabilities: null,
      addrs: node.getMultiaddrs().map(String),
      proximity: {},
      lastSeen: now,
    };
    return [self, ...[...registry.values()].sort((a, b) => a.peerId.localeCompare(b.peerId))];
  };
  /** Records an announcement (direct or gossiped) from an authenticated peer; throws on bad input. */
  const record = (m: Record<string, unknown>, from: PeerId) => {
    const roles = parseRoles(m.roles);
    if (roles.includes('validator')) throw new InvalidMessageError('a peer cannot announce itself as a validator');
    if (!registry.has(from.toString())) log.info('peer-joined', { remote: from.toString(), roles });
    registry.set(from.toString(), {
      peerId: from.toString(),
      roles,
      capabilities: m.capabilities === undefined ? null : parseCapabilities(m.capabilities),
      addrs: parseAddrs(m.addrs ?? []),
      proximity: parseProximity(m.proximity),
      lastSeen: Date.now(),
    });
  };
  // Gossip: signed messages, so `from` is the publisher; a malformed record is dropped.
  node.services.pubsub.subscribe(PEERS_TOPIC);
  node.services.pubsub.addEventListener('message', (evt) => {
    const msg = evt.detail;
    if (msg.topic !== PEERS_TOPIC || msg.type !== 'signed' || msg.data.length > 64 * 1024) return;
    try {
      record(JSON.parse(new TextDecoder().decode(msg.data)) as Record<string, unknown>, msg.from);
    } catch (err) {
      log.warn('bad-gossip', { remote: msg.from.toString(), error: (err as Error).message }); // untrusted input: dropped
    }
  });
  await serveControl(node, {
    announce: (m, from: PeerId) => {
      record(m, from);
      return { type: 'ack', ttlMs: PEER_TTL_MS };
    },
    status: () => ({ type: 'status', peers: peers(), uptimeMs: Date.now() - started }),
  });
  return {
    node,
    peers,
    stop: async () => {
      await node.stop();
    },
  };
}
