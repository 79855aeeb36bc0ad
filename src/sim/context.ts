/** What every part of the simulation shares: the clock, randomness by purpose, the world, and what it counts. */
import type { HostedModelEntry, PeerRecord } from '../p2p/index.ts';
import type { Reputation } from '../verify/reputation.ts';
import type { VirtualClock } from './clock.ts';
import type { SimCheat, SimPeer, SimUser } from './population.ts';
import type { Random } from './random.ts';
import type { Relay } from './world.ts';

/** A hosted model of the scenario: blocks of a decoder, each `blockParams` parameters (held in bf16). */
export interface SimModel {
  name: string;
  hash: string;
  blocks: number;
  blockParams: number;
  /** Share of sessions that ask for it. */
  weight: number;
}

/** FLOPs of one block for one token (two per parameter), and its bytes in bf16. */
export const blockFlops = (m: SimModel) => 2 * m.blockParams;
export const blockBytes = (m: SimModel) => 2 * m.blockParams;

/** What a piece of work (a session's hop, a job's stage over some steps) leaves for the ledger and for pay. */
export interface Work {
  peer: string;
  job: string;
  user: string;
  flops: number;
  at: number;
}

export interface SimContext {
  clock: VirtualClock;
  rng: { churn: Random; sessions: Random; checks: Random; jobs: Random; hosts: Random; probes: Random };
  peers: SimPeer[];
  byId: Map<string, SimPeer>;
  users: SimUser[];
  models: SimModel[];
  relay: Relay;
  reputation: Reputation;
  /** The validator's view, as of its last refresh: live records (excluded ones marked) and the model index. */
  view: { live: PeerRecord[]; models: Map<string, HostedModelEntry> };
  /** Work done, for the ledger's blocks and the epoch's pay. */
  work: Work[];
  /** Requests the validator answered, by kind. */
  requests: Record<string, number>;
  /** Catches: each cheater caught, when, and how long after it began to cheat. */
  catches: { peer: string; kind: SimCheat; at: number; afterMs: number }[];
  /** Honest peers flagged (a check that failed on honest work). */
  honestFlagged: string[];
  /** Sampled checks a peer's work went through, and FLOPs it skipped by cheating, by peer. */
  skippedFlops: Map<string, number>;
  /** Flags a peer whose check failed (once): excluded from routes and plans, its stake slashed at the epoch. */
  flag(peer: SimPeer, reason: string): void;
}
