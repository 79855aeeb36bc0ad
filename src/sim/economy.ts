/**
 * The simulation's ledger and pay, by the project's own arithmetic: the work done goes into blocks (makeBlock: the
 * Merkle root over each record's leaf; 512 records a block, as the ledger service makes them), each virtual hour is an
 * epoch whose escrows release the work's price (paidWork) and whose pool is shared by work times reputation
 * (epochRewards, the validators' share included). A caught cheater is slashed half its stake (SLASH_BPS) once.
 * Records here are not signed (no signature is checked in a simulation); their fields are what the ledger hashes.
 */
import { MIN_STAKE, PRICE_PER_FLOP, SLASH_BPS } from '../chain/constants.ts';
import { type Block, epochRewards, makeBlock, paidWork } from '../ledger/index.ts';
import type { LedgerRecord } from '../ledger/acceptance.ts';
import { VALIDATOR_SHARE_BPS } from '../validator/settlement.ts';
import type { SimContext, Work } from './context.ts';
import { SIM_CHEATS, type SimCheat } from './population.ts';

/** Records a block holds at most (validator/ledger-service.ts). */
const BLOCK_RECORDS = 512;
const EPOCH_MS = 3_600_000;
const TOKEN = 10n ** 18n;
const tokens = (units: bigint) => Number((units * 1000n) / TOKEN) / 1000;

export interface CheatEconomics {
  kind: SimCheat;
  /** Cheaters of the kind that did work, and of them those caught. */
  cheaters: number;
  caught: number;
  /** Mean minutes from its first cheating work to its flag, over those caught. */
  minutesToCatch: number | null;
  /** Mean over cheaters of the kind, in tokens: paid − slashed + the price of the compute it skipped − what honest work pays. */
  expectedGain: number;
}

export interface Economy {
  blocks: number;
  records: number;
  /** Tokens paid to workers and validators, over all epochs. */
  paid: number;
  slashed: number;
  cheats: CheatEconomics[];
}

export function settle(ctx: SimContext, hours: number): Economy {
  // blocks over the work in time order
  const ordered = [...ctx.work].sort((a, b) => a.at - b.at);
  let prev: Block['header'] | null = null;
  let blocks = 0;
  for (let i = 0; i < ordered.length; i += BLOCK_RECORDS) {
    const records = ordered.slice(i, i + BLOCK_RECORDS).map(ledgerRecord);
    const block = makeBlock(prev, records, ordered[i].at);
    prev = block.header;
    blocks++;
  }
  // each epoch's pay: every user's escrow holds enough; the workers' accounts are their ids
  const received = new Map<string, bigint>();
  let paid = 0n;
  const epochs = Math.ceil(hours);
  for (let e = 0; e < epochs; e++) {
    const inEpoch = ordered.filter((w) => w.at >= e * EPOCH_MS && w.at < (e + 1) * EPOCH_MS);
    const { releases, work } = paidWork(
      inEpoch.map((w) => ({ peer: w.peer, job: w.job, user: w.user, flops: Math.round(w.flops) })),
      (_job, user) => ({ payer: user, held: 10n ** 40n }),
      (peer) => peer,
      PRICE_PER_FLOP,
    );
    const pool = releases.reduce((a, r) => a + r.amount, 0n);
    const end = (e + 1) * EPOCH_MS;
    const workers = [...work].map(([peer, flops]) => {
      const p = ctx.byId.get(peer)!;
      const flagged = p.excluded && (p.caughtAt ?? Infinity) <= end;
      return { account: peer, work: flops, reputation: flagged ? 0 : ctx.reputation.standing(peer).score };
    });
    const { rewards } = epochRewards(pool, VALIDATOR_SHARE_BPS, workers, [{ account: 'validator', blocks: Math.max(1, blocks) }]);
    for (const [account, amount] of rewards) {
      received.set(account, (received.get(account) ?? 0n) + amount);
      paid += amount;
    }
  }
  const slash = (MIN_STAKE * SLASH_BPS) / 10_000n;
  const workOf = new Map<string, number>();
  for (const w of ctx.work) workOf.set(w.peer, (workOf.get(w.peer) ?? 0) + w.flops);
  const cheats = SIM_CHEATS.map((kind): CheatEconomics => {
    // the cheaters of the kind that did work (one that never computed had nothing to cheat on)
    const of = ctx.peers.filter((p) => p.cheat === kind && ctx.skippedFlops.has(p.id));
    const caught = ctx.catches.filter((c) => c.kind === kind);
    const gains = of.map((p) => {
      const honest = BigInt(Math.round(workOf.get(p.id) ?? 0)) * PRICE_PER_FLOP;
      const saved = BigInt(Math.round(ctx.skippedFlops.get(p.id) ?? 0)) * PRICE_PER_FLOP;
      return tokens((received.get(p.id) ?? 0n) + saved - (p.excluded ? slash : 0n) - honest);
    });
    return {
      kind,
      cheaters: of.length,
      caught: caught.length,
      minutesToCatch: caught.length ? caught.reduce((a, c) => a + c.afterMs, 0) / caught.length / 60_000 : null,
      expectedGain: gains.length ? gains.reduce((a, b) => a + b, 0) / gains.length : 0,
    };
  });
  const slashed = ctx.peers.filter((p) => p.excluded).length;
  return { blocks, records: ordered.length, paid: tokens(paid), slashed: tokens(slash * BigInt(slashed)), cheats };
}

/** A work item as the ledger holds a record: its job, the layers' kind of computation, its FLOPs and its worker. */
function ledgerRecord(w: Work, i: number): LedgerRecord {
  return {
    job: w.job, step: i, micro: 0, stage: [0, 1], kind: 'forward', input: '', output: '', weights: '',
    flops: Math.round(w.flops), backend: 'sim', peer: w.peer, seq: i, sig: '',
  };
}
