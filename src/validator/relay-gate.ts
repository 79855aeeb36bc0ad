import { peerIdFromString } from '@libp2p/peer-id';
import { type RelayGate, STAGE_PROTOCOL, type TensorLinkNode } from '../p2p/index.ts';

/** How long a peer that asked the validator something counts as known to its relay. */
export const KNOWN_FOR_MS = 3_600_000;
/** How long a reservation waits for its peer's identify to say what it runs. */
const IDENTIFY_WAIT_MS = 3_000;

/**
 * Whom a validator's relay serves: slots for workers (peers that run the stage protocol, which identify tells, or that
 * announced), and relayed connections to them for the peers it knows (workers, and users that asked it for the
 * registry, a plan or a session within KNOWN_FOR_MS). Everyone else is refused: the relay is the swarm's, not an open one.
 */
export class ValidatorRelayGate implements RelayGate {
  private readonly asked = new Map<string, number>();
  node: TensorLinkNode | null = null;

  constructor(private readonly announced: (peer: string) => boolean) {}

  /** A peer asked the validator something (any control request). */
  heard(peer: string): void {
    this.asked.set(peer, Date.now());
    if (this.asked.size > 100_000) for (const [p, at] of this.asked) if (at < Date.now() - KNOWN_FOR_MS) this.asked.delete(p);
  }

  private async runsWorker(peer: string, waitMs: number): Promise<boolean> {
    const until = Date.now() + waitMs;
    for (;;) {
      try {
        const p = await this.node?.peerStore.get(peerIdFromString(peer));
        if (p?.protocols.includes(STAGE_PROTOCOL)) return true;
      } catch {
        // not in the peer store yet
      }
      if (Date.now() >= until) return false;
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  async mayReserve(peer: string): Promise<boolean> {
    return this.announced(peer) || this.runsWorker(peer, IDENTIFY_WAIT_MS);
  }

  async mayConnect(from: string): Promise<boolean> {
    if (this.announced(from) || (this.asked.get(from) ?? 0) >= Date.now() - KNOWN_FOR_MS) return true;
    return this.runsWorker(from, 0);
  }
}
