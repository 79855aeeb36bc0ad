/** Buckets kept before those of peers quiet for a second (full again) are dropped, at most once a second. */
const MAX_BUCKETS = 10_000;

/**
 * A token bucket per peer: `rate` messages per second with bursts of up to `rate`. A peer
 * over its rate is answered with RateLimitedError and not served; other peers are unaffected.
 */
export class PeerRateLimiter {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();
  private swept = 0;

  constructor(private readonly rate: number) {}

  /** Takes one token from `peer`'s bucket; false when it has none left. */
  allow(peer: string): boolean {
    const now = Date.now();
    const b = this.buckets.get(peer) ?? { tokens: this.rate, at: now };
    b.tokens = Math.min(this.rate, b.tokens + ((now - b.at) / 1000) * this.rate);
    b.at = now;
    this.buckets.set(peer, b);
    // peers heard once and gone (gossip's publishers are not always connected): a full bucket is as good as none
    if (this.buckets.size > MAX_BUCKETS && now - this.swept >= 1000) {
      this.swept = now;
      for (const [p, x] of this.buckets) if (now - x.at >= 1000) this.buckets.delete(p);
    }
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }

  /** Forgets a peer (it disconnected): its bucket would be full again anyway. */
  forget(peer: string): void {
    this.buckets.delete(peer);
  }
}
