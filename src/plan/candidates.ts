/**
 * The devices a plan is made over when the swarm is large: the planner's work and what a user reads grow with the
 * workers it weighs, and past a few hundred the slower ones are never chosen. PLAN_CANDIDATES (or four per layer, for
 * a deeper model) of the fastest are kept, in the order given.
 */
export const PLAN_CANDIDATES = 256;

/** The `limit` fastest of `devices` with memory free (ties: more memory first, then the order given), in the order given. */
export function planCandidates<T extends { gflops: number; memoryBytes: number }>(
  devices: readonly T[], layers: number, limit = PLAN_CANDIDATES,
): T[] {
  const keep = Math.max(limit, 4 * layers);
  if (devices.length <= keep) return [...devices];
  // a worker with nothing free can hold no layer, however fast
  const ranked = devices.map((d, i) => ({ d, i })).filter(({ d }) => d.memoryBytes > 0);
  ranked.sort((a, b) => b.d.gflops - a.d.gflops || b.d.memoryBytes - a.d.memoryBytes || a.i - b.i);
  const chosen = new Set(ranked.slice(0, keep).map((r) => r.i));
  return devices.filter((_, i) => chosen.has(i));
}
