import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { InvalidArgumentError } from '../errors.ts';
import type { DialTarget } from './dial.ts';

/** Validators one set holds at most: `--bootstrap`'s and those learnt from their answers. */
export const MAX_VALIDATORS = 16;

/** The peer id an address names (its last /p2p/), or null. */
function idOf(ma: Multiaddr): string | null {
  return ma.getComponents().findLast((c) => c.name === 'p2p')?.value ?? null;
}

/**
 * The validators a worker or a user may ask (`--bootstrap A,B,C`): a control request goes to the one that answered last
 * and moves on to the next when that one cannot be reached (src/p2p/protocols/control/client.ts), so losing a validator
 * loses no request that another could answer. Validators the answers name (`status` lists its validator's peers) join
 * the set, so one address is enough to find the others.
 */
export class Validators {
  private readonly list: Multiaddr[] = [];
  private at = 0;

  constructor(addrs: readonly (string | Multiaddr)[]) {
    for (const a of addrs) this.add(typeof a === 'string' ? parseBootstrap(a) : a);
    if (this.list.length === 0) throw new InvalidArgumentError('no validator address given');
  }

  /** `--bootstrap`'s value: one multiaddr, or several separated by commas (each best ending in /p2p/PEER-ID). */
  static parse(text: string): Validators {
    return new Validators(text.split(',').map((s) => s.trim()).filter((s) => s !== ''));
  }

  /** The validator asked next. */
  get current(): Multiaddr {
    return this.list[this.at];
  }

  /** Every address, the current one first. */
  get all(): Multiaddr[] {
    return [...this.list.slice(this.at), ...this.list.slice(0, this.at)];
  }

  /** The validators' peer ids (a job names them as the peers that may re-run its work). */
  ids(): string[] {
    return this.list.flatMap((ma) => idOf(ma) ?? []);
  }

  /** `addr` did not answer: the next one is asked from now on (unless another request already moved on). */
  failed(addr: Multiaddr): void {
    if (this.list[this.at] === addr) this.at = (this.at + 1) % this.list.length;
  }

  /** Adds validators an answer named (their peer ids and addresses); known ones and those past MAX_VALIDATORS are left out. */
  learn(peers: readonly { peerId: string; addrs: readonly string[]; roles: readonly string[] }[]): void {
    for (const p of peers) {
      if (!p.roles.includes('validator') || this.ids().includes(p.peerId)) continue;
      // its own addresses (not through a relay), each naming it; a routable one before loopback and private ones
      const own = p.addrs.flatMap((a) => {
        try {
          const ma = multiaddr(a);
          const named = idOf(ma) === null ? ma.encapsulate(`/p2p/${p.peerId}`) : ma;
          return a.includes('/p2p-circuit') || idOf(named) !== p.peerId ? [] : [named];
        } catch {
          return []; // an address that does not parse: the validator is found through another
        }
      });
      const local = (ma: Multiaddr) => /^\/ip4\/(127\.|10\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)/.test(ma.toString());
      const best = own.find((ma) => !local(ma)) ?? own[0];
      if (best !== undefined) this.add(best);
    }
  }

  toString(): string {
    return this.list.map(String).join(',');
  }

  /** Adds an address (one without /p2p/ is dialled as it is: the peer it reaches is the validator, by its id unknown here). */
  private add(ma: Multiaddr): void {
    if (this.list.length >= MAX_VALIDATORS) return;
    const id = idOf(ma);
    const known = id === null ? this.list.some((m) => m.toString() === ma.toString()) : this.ids().includes(id);
    if (!known) this.list.push(ma);
  }
}

/** `--bootstrap`'s text (one validator's address, or several separated by commas) as a set to ask; a target as given. */
export function validatorTarget(validator: string | DialTarget): DialTarget {
  return typeof validator === 'string' ? Validators.parse(validator) : validator;
}

function parseBootstrap(text: string): Multiaddr {
  try {
    return multiaddr(text);
  } catch {
    throw new InvalidArgumentError(`'${text}' is not a multiaddr (a validator's address, e.g. /ip4/203.0.113.7/tcp/4001/p2p/12D3Koo…)`);
  }
}
