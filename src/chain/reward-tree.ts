import { type Address, encodeAbiParameters, type Hex, keccak256 } from 'viem';

/**
 * The Merkle tree of an epoch's rewards as the settlement contract checks a claim: a leaf is
 * keccak256(keccak256(abi.encode(account, amount))) (hashed twice, so no inner node is a leaf),
 * and a pair hashes in sorted order (OpenZeppelin's MerkleProof), so a proof is its siblings.
 */
export function rewardLeaf(account: Address, amount: bigint): Hex {
  return keccak256(keccak256(encodeAbiParameters([{ type: 'address' }, { type: 'uint256' }], [account, amount])));
}

function pair(a: Hex, b: Hex): Hex {
  return keccak256(`0x${(a < b ? a + b.slice(2) : b + a.slice(2)).slice(2)}`);
}

export class RewardTree {
  private readonly levels: Hex[][];
  private readonly index = new Map<string, number>();

  constructor(readonly rewards: ReadonlyMap<Address, bigint>) {
    const leaves = [...rewards].map(([a, v]) => rewardLeaf(a, v));
    [...rewards.keys()].forEach((a, i) => this.index.set(a.toLowerCase(), i));
    this.levels = [leaves];
    while (this.levels.at(-1)!.length > 1) {
      const below = this.levels.at(-1)!;
      const up: Hex[] = [];
      for (let i = 0; i < below.length; i += 2) up.push(i + 1 < below.length ? pair(below[i], below[i + 1]) : below[i]);
      this.levels.push(up);
    }
  }

  /** The root the validators post (zero for an epoch without rewards, which the contract refuses: settle none then). */
  get root(): Hex {
    return this.levels[0].length === 0 ? `0x${'0'.repeat(64)}` : this.levels.at(-1)![0];
  }

  get total(): bigint {
    return [...this.rewards.values()].reduce((a, b) => a + b, 0n);
  }

  /** The siblings from `account`'s leaf up (null when it earned nothing this epoch). */
  proof(account: Address): Hex[] | null {
    let i = this.index.get(account.toLowerCase());
    if (i === undefined) return null;
    const out: Hex[] = [];
    for (const level of this.levels.slice(0, -1)) {
      const j = i ^ 1;
      if (j < level.length) out.push(level[j]);
      i >>= 1;
    }
    return out;
  }
}
