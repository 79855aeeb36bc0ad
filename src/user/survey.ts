/**
 * What a job is planned over, from the registry's records alone (pure): distribute's survey and the simulation's
 * placement (src/sim/training.ts) both make their plans through these, so a simulated swarm plans as a real one does.
 */
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import type { PeerRecord } from '../p2p/index.ts';
import { type Device, PLAN_CANDIDATES, planCandidates, type PlanOptions } from '../plan/index.ts';

/**
 * Of the workers a user trusts, the fastest PLAN_CANDIDATES per copy (the planner never picks the slow ones, and weighs
 * fewer), split into `copies` disjoint groups (replicas or redundant copies); the plan is made on the first group, each
 * device offering the least memory free among its counterparts in the other groups.
 */
export function surveyWorkers(
  trusted: readonly PeerRecord[], blocks: number, copies: number,
): { groups: PeerRecord[][]; devices: Device[] } {
  if (!Number.isInteger(copies) || copies < 1) throw new InvalidArgumentError(`replicas and redundancy must be integers ≥ 1, got ${copies}`);
  const speeds = trusted.map((w) => {
    const c = w.capabilities!;
    return { w, gflops: c.gflops, memoryBytes: c.memoryFreeBytes ?? c.memoryBytes };
  });
  const workers = planCandidates(speeds, blocks, PLAN_CANDIDATES * copies).map((c) => c.w);
  if (workers.length < copies) {
    throw new PlanInfeasibleError(`${copies} copies of each section (replicas or redundancy) need at least ${copies} workers; the validator trusts ${workers.length}`);
  }
  const perGroup = Math.floor(workers.length / copies);
  const groups = Array.from({ length: copies }, (_, j) => workers.slice(j * perGroup, (j + 1) * perGroup));
  const devices: Device[] = groups.map((group) => group.map((w) => {
    const { memoryBytes, memoryFreeBytes, gflops } = w.capabilities!;
    return { id: w.peerId, memoryBytes: memoryFreeBytes ?? memoryBytes, gflops };
  })).reduce((a, b) => a.map((d, i) => ({ ...d, memoryBytes: Math.min(d.memoryBytes, b[i].memoryBytes) })));
  return { groups, devices };
}

/**
 * Bytes a worker holds per byte of its section's weights: 1 to serve it; training adds gradients and AdamW's two moments
 * (4), and verification the weights, moments and gradients each step started from (8).
 */
export function memoryFactor(training: boolean, verifying: boolean): number {
  return training ? (verifying ? 8 : 4) : 1;
}

/** The planner's options for a job: its user, what the user sends the first section per token, and what travels. */
export function jobPlanOptions(o: {
  user: string; inputBytesPerToken: number; training: boolean; tokens?: number; routing?: 'chain' | 'relay';
}): PlanOptions {
  return {
    tokens: o.tokens ?? 1,
    // the user sends the first section its input (hidden states it embedded, or token ids) and takes the last's output
    user: o.user,
    inputBytesPerToken: o.inputBytesPerToken,
    traffic: o.training ? 'train' : (o.routing ?? 'chain') === 'relay' ? 'relay' : 'chain',
  };
}
