/** How long a peer that asked the validator something counts as known to its relay. */
export const KNOWN_FOR_MS = 3_600_000;

/**
 * Whom a validator's relay serves: slots for workers that announced themselves (a worker behind NAT takes its slot
 * after its first announcement), and relayed connections for the peers it knows (those workers, and users that asked
 * it for the registry, a plan or a session within KNOWN_FOR_MS). Everyone else is refused: the relay is the swarm's.
 */
export class ValidatorRelayGate {
  private readonly asked = new Map<string, number>();

  constructor(private readonly announced: (peer: string) => boolean) {}

  /** A peer asked the validator something (any control request). */
  heard(peer: string): void {
    this.asked.set(peer, Date.now());
    if (this.asked.size > 100_000) for (const [p, at] of this.asked) if (at < Date.now() - KNOWN_FOR_MS) this.asked.delete(p);
  }

  mayReserve(peer: string): boolean {
    return this.announced(peer);
  }

  mayConnect(from: string): boolean {
    return this.announced(from) || (this.asked.get(from) ?? 0) >= Date.now() - KNOWN_FOR_MS;
  }
}
