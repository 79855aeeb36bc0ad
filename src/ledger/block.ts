import { createHash } from 'node:crypto';
import { InvalidMessageError } from '../errors.ts';
import { bytesSignatureValid, recordId, type RecordSigner, signatureValid, signBytes } from '../verify/records/index.ts';
import { acceptanceValid, type LedgerRecord, parseLedgerRecord } from './acceptance.ts';
import { leafHash, type MerkleProof, MerkleTree, rootFromProof } from './merkle.ts';

/** What a block commits to; its hash is what validators sign and what the next block names. */
export interface BlockHeader {
  height: number;
  /** The previous header's hash ('' for the first block). */
  prev: string;
  /** The Merkle root of the block's records (their leaves, `recordLeaf`, in order). */
  root: string;
  /** How many records the block holds. */
  count: number;
  /** When it was made (ms since the epoch, the proposing validator's clock). */
  time: number;
}

/** A validator's signature of a header hash. */
export interface HeaderSignature {
  validator: string;
  sig: string;
}

export interface Block {
  header: BlockHeader;
  signatures: HeaderSignature[];
  records: LedgerRecord[];
}

/** Who may sign headers, and how many of them must: the ledger's rule, known to every verifier. */
export interface SignerSet {
  /** The raw Ed25519 public key of a validator's peer id (throws for anything that is not one). */
  keyOf: (validator: string) => Uint8Array;
  /** The validators whose signatures count (absent: any peer id with an Ed25519 key). */
  validators?: ReadonlySet<string>;
  threshold: number;
}

const HEADER_FIELDS: readonly (keyof BlockHeader)[] = ['height', 'prev', 'root', 'count', 'time'];

/** The bytes a header's hash covers: its fields in a fixed order, as JSON. */
export function headerBytes(h: BlockHeader): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(HEADER_FIELDS.map((k) => [k, h[k]])));
}

export function headerHash(h: BlockHeader): string {
  return createHash('sha256').update(headerBytes(h)).digest('hex');
}

/**
 * The leaf of a record in a block's tree: the hash of its id, and of who accepted it and their
 * signature when a user did (so the header commits to whose escrow may pay it).
 */
export function recordLeaf(r: LedgerRecord): string {
  return leafHash(r.by ? `${recordId(r)}\n${r.by.user}\n${r.by.sig}` : recordId(r));
}

/** A new unsigned block over `records`, after `prev` (null: the first). */
export function makeBlock(prev: BlockHeader | null, records: LedgerRecord[], time: number): Block {
  const tree = new MerkleTree(records.map(recordLeaf));
  const header = { height: prev ? prev.height + 1 : 0, prev: prev ? headerHash(prev) : '', root: tree.root, count: records.length, time };
  return { header, signatures: [], records };
}

/** A validator's signature of a header. */
export function signHeader(h: BlockHeader, signer: RecordSigner): HeaderSignature {
  return { validator: signer.peer, sig: signBytes(new TextEncoder().encode(headerHash(h)), signer) };
}

/** The distinct validators of `signers` whose signatures of `h` are valid. */
export function validSigners(h: BlockHeader, signatures: readonly HeaderSignature[], signers: SignerSet): string[] {
  const hash = new TextEncoder().encode(headerHash(h));
  const ok = new Set<string>();
  for (const s of signatures) {
    if (ok.has(s.validator) || (signers.validators && !signers.validators.has(s.validator))) continue;
    let key: Uint8Array;
    try {
      key = signers.keyOf(s.validator);
    } catch {
      continue;
    }
    if (bytesSignatureValid(hash, s.sig, key)) ok.add(s.validator);
  }
  return [...ok];
}

/**
 * Why a block is not valid after `prev` (null: it is): its root, count, chain, the signatures of
 * its records (and of their acceptances) and of its validators are checked.
 */
export function blockProblem(
  block: Block, prev: BlockHeader | null, signers: SignerSet, options: { recordsChecked?: boolean } = {},
): string | null {
  const { header } = block;
  const expected = makeBlock(prev, block.records, header.time).header;
  if (header.height !== expected.height) return `height ${header.height} does not follow ${prev?.height ?? 'nothing'}`;
  if (header.prev !== expected.prev) return `block ${header.height} does not name the previous header`;
  if (header.count !== block.records.length || header.root !== expected.root) return `block ${header.height}'s root is not the root of its records`;
  // a block its validator made of records it checked as they came needs no second check of them
  for (const [i, r] of options.recordsChecked ? [] : block.records.entries()) {
    let key: Uint8Array | null = null;
    try {
      key = signers.keyOf(r.peer);
    } catch {
      // no key: the signature cannot be valid
    }
    if (!key || !signatureValid(r, key)) return `block ${header.height}'s record ${i} is not signed by its worker ${r.peer}`;
    if (!acceptanceValid(r, signers.keyOf)) return `block ${header.height}'s record ${i} is not signed by the user ${r.by!.user} it names`;
  }
  const n = validSigners(header, block.signatures, signers).length;
  if (n < signers.threshold) return `block ${header.height} has ${n} valid validator signatures; ${signers.threshold} are needed`;
  return null;
}

/** What anyone needs to check offline that a record is in the ledger: the record, its path, and the signed header. */
export interface InclusionProof {
  record: LedgerRecord;
  proof: MerkleProof;
  header: BlockHeader;
  signatures: HeaderSignature[];
}

/** The inclusion proof of the record `id` in `block` (a typed error when it is not there). */
export function inclusionProof(block: Block, id: string): InclusionProof {
  const index = block.records.findIndex((r) => recordId(r) === id);
  if (index < 0) throw new InvalidMessageError(`record ${id} is not in block ${block.header.height}`);
  const tree = new MerkleTree(block.records.map(recordLeaf));
  return { record: block.records[index], proof: tree.proof(index), header: block.header, signatures: block.signatures };
}

/**
 * Why an inclusion proof fails (null: it holds): the record must be signed by its worker (and by
 * the user it names as accepting it), its path must lead to the header's root, and the header
 * must carry enough validator signatures.
 */
export function inclusionProblem(p: InclusionProof, signers: SignerSet): string | null {
  let record: LedgerRecord;
  try {
    record = parseLedgerRecord(p.record);
  } catch (err) {
    return `the record is malformed: ${(err as Error).message}`;
  }
  let key: Uint8Array;
  try {
    key = signers.keyOf(record.peer);
  } catch {
    return `the record's peer ${record.peer} has no Ed25519 key`;
  }
  if (!signatureValid(record, key)) return 'the record is not signed by its worker';
  if (!acceptanceValid(record, signers.keyOf)) return `the record's acceptance is not signed by the user it names (${record.by!.user})`;
  if (p.proof?.size !== p.header.count) {
    return `the path's tree size (${p.proof?.size}) is not the number of records in the block (${p.header.count})`;
  }
  if (rootFromProof(recordLeaf(record), p.proof) !== p.header.root) return 'the path does not lead from the record to the header’s root';
  const n = validSigners(p.header, p.signatures ?? [], signers).length;
  if (n < signers.threshold) return `the header has ${n} valid validator signatures; ${signers.threshold} are needed`;
  return null;
}
