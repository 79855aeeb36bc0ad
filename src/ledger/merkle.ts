import { createHash } from 'node:crypto';
import { InvalidMessageError } from '../errors.ts';

/**
 * A sha256 Merkle tree over a block's records. Leaves and inner nodes hash with different
 * prefixes (0x00, 0x01), so an inner node can never pass for a leaf; a level of odd length
 * carries its last node up unchanged (no duplication, so two different lists never share a
 * root). A proof names the leaf's index and the tree's size: with them the path is fixed.
 */

const LEAF = Buffer.from([0]);
const NODE = Buffer.from([1]);
const HEX64 = /^[0-9a-f]{64}$/;

/** The hash of a leaf: sha256(0x00 ‖ the leaf's bytes), hex. */
export function leafHash(data: Uint8Array | string): string {
  return createHash('sha256').update(LEAF).update(data).digest('hex');
}

/** The hash of an inner node: sha256(0x01 ‖ left ‖ right), hex. */
export function nodeHash(left: string, right: string): string {
  return createHash('sha256').update(NODE).update(Buffer.from(left, 'hex')).update(Buffer.from(right, 'hex')).digest('hex');
}

/** The root of an empty tree: what a block without records names. */
export const EMPTY_ROOT = createHash('sha256').update('').digest('hex');

/** A leaf's path to the root: the siblings from the bottom up (a level where it had none is skipped). */
export interface MerkleProof {
  index: number;
  size: number;
  siblings: string[];
}

export class MerkleTree {
  /** Every level, leaves first. */
  private readonly levels: string[][];

  /** `leaves`: the leaf hashes (`leafHash`), in block order. */
  constructor(leaves: readonly string[]) {
    this.levels = [[...leaves]];
    while (this.levels.at(-1)!.length > 1) {
      const below = this.levels.at(-1)!;
      const up: string[] = [];
      for (let i = 0; i < below.length; i += 2) up.push(i + 1 < below.length ? nodeHash(below[i], below[i + 1]) : below[i]);
      this.levels.push(up);
    }
  }

  get size(): number {
    return this.levels[0].length;
  }

  get root(): string {
    return this.size === 0 ? EMPTY_ROOT : this.levels.at(-1)![0];
  }

  proof(index: number): MerkleProof {
    if (!Number.isInteger(index) || index < 0 || index >= this.size) throw new InvalidMessageError(`no leaf ${index} in a tree of ${this.size}`);
    const siblings: string[] = [];
    let i = index;
    for (const level of this.levels.slice(0, -1)) {
      const j = i ^ 1;
      if (j < level.length) siblings.push(level[j]);
      i >>= 1;
    }
    return { index, size: this.size, siblings };
  }
}

/** The root a proof leads to from `leaf`, or null when the proof is malformed (wrong length, bad index, not hashes). */
export function rootFromProof(leaf: string, proof: MerkleProof): string | null {
  const { index, size, siblings } = proof;
  if (!Number.isSafeInteger(index) || !Number.isSafeInteger(size) || index < 0 || index >= size || !Array.isArray(siblings)) return null;
  let h = leaf;
  let i = index;
  let width = size;
  let k = 0;
  while (width > 1) {
    const j = i ^ 1;
    if (j < width) {
      const s = siblings[k++];
      if (typeof s !== 'string' || !HEX64.test(s)) return null;
      h = i % 2 === 0 ? nodeHash(h, s) : nodeHash(s, h);
    }
    i >>= 1;
    width = Math.ceil(width / 2);
  }
  return k === siblings.length ? h : null;
}

/** Whether `proof` leads from `leaf` to `root`. */
export function verifyProof(leaf: string, proof: MerkleProof, root: string): boolean {
  return rootFromProof(leaf, proof) === root;
}
