export {
  type Acceptance, acceptanceBytes, acceptanceValid, acceptRecord, entryKey, type LedgerRecord, parseLedgerRecord,
} from './acceptance.ts';
export {
  type Block, type BlockHeader, blockProblem, headerBytes, headerHash, type HeaderSignature, inclusionProblem, type InclusionProof,
  inclusionProof, makeBlock, recordLeaf, signHeader, type SignerSet, validSigners,
} from './block.ts';
export { EMPTY_ROOT, leafHash, type MerkleProof, MerkleTree, nodeHash, rootFromProof, verifyProof } from './merkle.ts';
export { type EpochRecord, escrowJobOf, type JobEscrow, type PaidWork, paidWork, type Release } from './paid-work.ts';
export { type EpochRewards, epochRewards, type ValidatorEpoch, type WorkerEpoch } from './rewards.ts';
