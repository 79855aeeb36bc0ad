import type { PeerId } from '@libp2p/interface';
import {
  createLogger, createNode, type Logger, MAX_GOSSIP_BYTES, PEERS_TOPIC, parseAnnounce, parseAuditMessage, type PeerRecord, serveControl,
  type TensorLinkNode,
} from '../p2p/index.ts';
import { parseRecord, Reputation, type Standing } from '../verify/index.ts';
import { audit } from './audit.ts';
import { PEER_TTL_MS, Registry } from './registry.ts';

/** Re-executions a validator runs at once; more wait their turn. */
export const MAX_CONCURRENT_AUDITS = 2;

/** At most `n` tasks at once, the rest queued in order. */
class Slots {
  private running = 0;
  private readonly queue: (() => void)[] = [];

  constructor(private readonly n: number) {}

  async run<T>(task: () => Promise<T>): Promise<T> {
    if (this.running >= this.n) await new Promise<void>((resolve) => this.queue.push(resolve));
    this.running++;
    try {
      return await task();
    } finally {
      this.running--;
      this.queue.shift()?.();
    }
  }
}

export interface Validator {
  node: TensorLinkNode;
  /** The live peers, the validator first, each worker with its reputation. */
  peers(): PeerRecord[];
  /** Its checks of workers' records so far. */
  reputation: Reputation;
  stop(): Promise<void>;
}

export interface ValidatorOptions {
  dataDir?: string;
  listen?: string[];
  log?: Logger;
}

/**
 * The validator: bootstrap peer and DHT server, keeper of the registry of workers (fed
 * by their announcements), answering `status` with the swarm's state.
 */
export async function startValidator(options: ValidatorOptions = {}): Promise<Validator> {
  const node = await createNode(options);
  const log = options.log ?? createLogger({ level: 'silent' });
  const registry = new Registry(log);
  const reputation = new Reputation();
  const auditSlots = new Slots(MAX_CONCURRENT_AUDITS);
  const withStanding = (p: PeerRecord): PeerRecord => {
    if (!p.roles.includes('worker')) return p;
    const s: Standing = reputation.standing(p.peerId);
    return { ...p, reputation: s.score, checks: { passed: s.passed, failed: s.failed }, excluded: s.excluded };
  };
  const started = Date.now();
  const peers = (): PeerRecord[] => {
    const self: PeerRecord = {
      peerId: node.peerId.toString(),
      roles: ['validator'],
      capabilities: null,
      addrs: node.getMultiaddrs().map(String),
      proximity: {},
      lastSeen: Date.now(),
    };
    return [self, ...registry.live().map(withStanding)];
  };
  // Gossip: signed messages, so `from` is the publisher; a malformed record is dropped.
  node.services.pubsub.subscribe(PEERS_TOPIC);
  node.services.pubsub.addEventListener('message', (evt) => {
    const msg = evt.detail;
    if (msg.topic !== PEERS_TOPIC || msg.type !== 'signed' || msg.data.length > MAX_GOSSIP_BYTES) return;
    try {
      registry.record(msg.from.toString(), parseAnnounce(JSON.parse(new TextDecoder().decode(msg.data)) as Record<string, unknown>));
    } catch (err) {
      log.warn('bad-gossip', { remote: msg.from.toString(), error: (err as Error).message }); // untrusted input: dropped
    }
  });
  await serveControl(node, {
    announce: (m, from: PeerId) => {
      registry.record(from.toString(), parseAnnounce(m));
      return { type: 'ack', ttlMs: PEER_TTL_MS };
    },
    status: () => ({ type: 'status', peers: peers(), uptimeMs: Date.now() - started }),
    // re-runs a record a user sampled (or two redundant workers disagree on) and scores its worker
    audit: async (m) => {
      const request = parseAuditMessage(m);
      const record = parseRecord(request.record);
      const worker = request.worker;
      // re-executions take CPU and memory: a few at a time, whoever asks
      const verdict = await auditSlots.run(() => audit(node, reputation, { ...request, record }));
      if (!verdict.ok) log.warn('worker-flagged', { peer: worker.peerId, record: `${record.kind} ${record.step}:${record.micro}`, reason: verdict.reason });
      return { type: 'audit-result', ...verdict };
    },
  });
  return {
    node,
    peers,
    reputation,
    stop: async () => {
      await node.stop();
    },
  };
}
