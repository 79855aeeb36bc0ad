/**
 * The validator's check of gossiped announcements, run by gossipsub before a message is delivered or forwarded: signed,
 * at most MAX_GOSSIP_BYTES, within its publisher's rate, well-formed, fresh and newer than the publisher's last. A
 * malformed one, or one past the rate from its publisher itself, is rejected (it counts against the peer that sent it,
 * and gossip-score.ts graylists a peer after a few: a flood then costs the validator a frame's decoding, not a signature
 * check each); a stale one, a replay, or one past the rate passed on by another peer is ignored (it may have come late
 * or bunched through an honest peer). Only checked announcements reach the registry or
 * go on to other validators. A graylisted peer still connected is hung up on.
 */
import { type Message, TopicValidatorResult } from '@libp2p/gossipsub';
import type { PeerId } from '@libp2p/interface';
import { type Announcement, GRAYLIST_THRESHOLD, type Logger, MAX_GOSSIP_BYTES, parseAnnounce, PeerRateLimiter, PEERS_TOPIC, type TensorLinkNode } from '../p2p/index.ts';
import { GossipFreshness, type Registry } from './registry.ts';

/** Announcements a publisher may gossip a second (bursts of as many): a worker sends one every 2 s, more when jobs come. */
export const GOSSIP_ANNOUNCEMENTS_PER_SECOND = 5;

/** What the check decided, counted since the validator started. */
export interface GossipStats {
  accepted: number;
  rejected: number;
  ignored: number;
  /** Peers hung up on: graylisted (their score below gossipsub's threshold) and still connected. */
  hungUp: number;
}

/** How often graylisted peers are looked for. */
const GRAYLIST_SWEEP_MS = 1_000;

/** `trusted`: peers never hung up on whatever their score (the validators of its set, which co-sign the ledger). */
export function checkGossip(
  node: TensorLinkNode, registry: Registry, log: Logger, trusted: (peer: string) => boolean = () => false,
): GossipStats {
  const stats: GossipStats = { accepted: 0, rejected: 0, ignored: 0, hungUp: 0 };
  const fresh = new GossipFreshness();
  const rate = new PeerRateLimiter(GOSSIP_ANNOUNCEMENTS_PER_SECOND);
  const checked = new WeakMap<Message, Announcement>();
  const verdict = (from: PeerId, msg: Message): TopicValidatorResult => {
    if (msg.type !== 'signed' || msg.data.length > MAX_GOSSIP_BYTES) return TopicValidatorResult.Reject;
    const publisher = msg.from.toString();
    // the rate is the publisher's own, spent only by what it sends itself: copies another peer passes on (a validator
    // forwards what it accepted; anyone may replay what it kept) never use it up, and are checked for freshness below
    if (from.equals(msg.from) && !rate.allow(publisher)) return TopicValidatorResult.Reject;
    let a: Announcement;
    try {
      a = parseAnnounce(JSON.parse(new TextDecoder().decode(msg.data)) as Record<string, unknown>);
      if (a.at === undefined) throw new Error('a gossiped announcement must say when it was made (at)');
      // validators are configured, never announced (the registry refuses the role)
      if (a.roles.includes('validator')) throw new Error('a peer cannot announce itself a validator');
    } catch (err) {
      log.warn('bad-gossip', { remote: publisher, error: (err as Error).message }); // untrusted input: dropped
      return TopicValidatorResult.Reject;
    }
    try {
      // signed by its publisher, but replayable by anyone who kept it: only a fresh record, newer than the last, counts
      checked.set(msg, fresh.check(publisher, a));
      return TopicValidatorResult.Accept;
    } catch (err) {
      log.debug('stale-gossip', { remote: publisher, error: (err as Error).message });
      return TopicValidatorResult.Ignore;
    }
  };
  node.services.pubsub.topicValidators.set(PEERS_TOPIC, (from, msg) => {
    const v = verdict(from, msg);
    if (v === TopicValidatorResult.Accept) stats.accepted++;
    else if (v === TopicValidatorResult.Reject) stats.rejected++;
    else stats.ignored++;
    return v;
  });
  // a graylisted peer's messages are dropped as they come, but still cost their decryption and decoding: it is hung up on
  // (its score outlives the connection: back, it is graylisted still, and hung up on again)
  const pubsub = node.services.pubsub as unknown as { getPeers(): PeerId[]; getScore(id: string): number };
  const sweep = setInterval(() => {
    for (const peer of pubsub.getPeers()) {
      if (pubsub.getScore(peer.toString()) >= GRAYLIST_THRESHOLD || trusted(peer.toString())) continue;
      stats.hungUp++;
      log.warn('gossip-hang-up', { remote: peer.toString(), score: Math.round(pubsub.getScore(peer.toString())) });
      void node.hangUp(peer).catch(() => {});
    }
  }, GRAYLIST_SWEEP_MS);
  sweep.unref?.();
  node.addEventListener('stop', () => clearInterval(sweep), { once: true });
  node.services.pubsub.subscribe(PEERS_TOPIC);
  node.services.pubsub.addEventListener('message', (evt) => {
    const a = checked.get(evt.detail);
    if (evt.detail.topic !== PEERS_TOPIC || evt.detail.type !== 'signed' || !a) return;
    try {
      registry.record(evt.detail.from.toString(), a);
    } catch (err) {
      // a listener that throws would end the process: what the registry refuses is logged and dropped
      log.warn('bad-gossip', { remote: evt.detail.from.toString(), error: (err as Error).message });
    }
  });
  return stats;
}
