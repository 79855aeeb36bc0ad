import type { Libp2p } from '@libp2p/interface';
import { MIN_STAKE } from '../chain/constants.ts';
import { type DialTarget, type Overview, parseOverview, parseStatusAnswer, type PeerRecord, request } from '../p2p/index.ts';

/**
 * The live peers a validator knows, its own record first: the user's one way to ask. The
 * answer is parsed record by record (a validator is a peer like any other: its answer is
 * untrusted input), so a malformed one is an InvalidMessageError, never a cast.
 * @example
 * const workers = (await listPeers(node, multiaddr(bootstrap))).filter((p) => p.roles.includes('worker'))
 */
export async function listPeers(node: Libp2p, validator: DialTarget, timeoutMs?: number): Promise<PeerRecord[]> {
  const peers: PeerRecord[] = [];
  // the registry comes a page at a time
  for (let page: number | undefined = 0; page !== undefined;) {
    const answer: ReturnType<typeof parseStatusAnswer> = parseStatusAnswer(await request(node, validator, { type: 'status', page }, timeoutMs));
    peers.push(...answer.peers);
    page = answer.next;
  }
  return peers;
}

/** The live workers a validator knows that have announced their capabilities. */
export async function listWorkers(node: Libp2p, validator: DialTarget): Promise<PeerRecord[]> {
  // a worker the validator flagged gets no new work; with a chain, neither does one without stake
  return (await listPeers(node, validator)).filter((p) => p.roles.includes('worker') && p.capabilities !== null && p.excluded !== true
    && (p.stake === undefined || BigInt(p.stake) >= MIN_STAKE));
}

/** The validator's overview of the swarm (peers, jobs, events, ledger): what its dashboard shows. */
export async function fetchOverview(node: Libp2p, validator: DialTarget): Promise<Overview> {
  return parseOverview(await request(node, validator, { type: 'overview' }));
}
