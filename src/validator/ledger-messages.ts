import { InvalidMessageError } from '../errors.ts';
import { type Block, type LedgerRecord, parseLedgerRecord } from '../ledger/index.ts';
import { int, list, obj, str, strings } from '../p2p/index.ts';
import { parseBlock } from './ledger-store.ts';

/**
 * The ledger's messages on the control protocol, parsed from untrusted peers:
 *
 *   ledger-submit  {records}              → ledger-accepted {accepted, duplicate, refused}   (a user, or a validator forwarding;
 *                                           each record with its user's acceptance `by`, which says whose escrow pays it)
 *   ledger-hello   {addrs}                → ledger-head {height, hash, account?}             (a validator joining)
 *   ledger-head    {}                     → ledger-head {height, hash, account?}
 *   ledger-blocks  {from}                 → ledger-blocks {blocks}    (one block at most: a block fits a control message)
 *   ledger-propose {block}                → ledger-signed {signature}
 *   ledger-commit  {block}                → ledger-head
 *   ledger-show    {height?}              → ledger-show {...}
 *   ledger-proof   {record}                   → ledger-proof {proof}
 */

/** Records one submission may carry: ~800 bytes each and ~150 for the user's acceptance, inside a 1 MiB control message. */
export const MAX_SUBMIT_RECORDS = 512;
/** Records in one block: a block travels in one control message (1 MiB) when a peer catches up. */
export const MAX_BLOCK_RECORDS = 512;

export function parseSubmit(m: Record<string, unknown>): LedgerRecord[] {
  return list(m.records, 'records', MAX_SUBMIT_RECORDS, (r) => parseLedgerRecord(r));
}

export function parseHello(m: Record<string, unknown>): string[] {
  return strings(m.addrs, 'addrs', 16);
}

export interface Head {
  height: number;
  hash: string;
  account?: string;
}

export function parseHead(m: Record<string, unknown>): Head {
  if (m.type !== 'ledger-head') throw new InvalidMessageError(`expected a ledger head, got '${String(m.type)}'`);
  const account = m.account === undefined ? undefined : str(m.account, 'account', 42);
  return { height: int(m.height, 'height'), hash: str(m.hash, 'hash', 64), ...(account ? { account } : {}) };
}

/** A block from a peer: typed, at most MAX_BLOCK_RECORDS records (its signatures and chain are checked by the store). */
export function parseBlockMessage(v: unknown): Block {
  const m = obj(v, 'block');
  if (Array.isArray(m.records) && m.records.length > MAX_BLOCK_RECORDS) throw new InvalidMessageError(`a block holds at most ${MAX_BLOCK_RECORDS} records`);
  try {
    return parseBlock(m);
  } catch (err) {
    throw new InvalidMessageError(`not a block: ${(err as Error).message}`);
  }
}

export function parseBlocksAnswer(m: Record<string, unknown>): Block[] {
  if (m.type !== 'ledger-blocks') throw new InvalidMessageError(`expected ledger blocks, got '${String(m.type)}'`);
  return list(m.blocks, 'blocks', 1, parseBlockMessage);
}
