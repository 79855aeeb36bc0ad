export { agree, type ComputeBackend, type ComputeFormat, drift, formatOfWeights, ORT_TOLERANCE, ORT_TOLERANCES, ortTolerance } from './compare.ts';
export { hashArrays, hashNamed, hashTensors } from './hash.ts';
export {
  bytesSignatureValid, checkRecord, type Expectation, parseRecord, RECORD_KINDS, type RecordKind, recordBytes, recordId, type RecordSigner,
  signatureValid, signBytes, signRecord, type WorkFields, type WorkRecord, type ChunkCheck, checkChunk, ChunkCommitter, closedChunks,
  COMMIT_CHUNK, COMMIT_TOPK, commitChunk,
} from './records/index.ts';
export {
  auxHash, type Bundle, checkpointHash, compactWeightOf, maxBundleBytes, rebuildSection, reexecute, sessionStepHash, type Verdict,
} from './reexec.ts';
export { checkCommitments, COMMIT_THRESHOLDS, type CommitBound, type SessionPrefill, type SessionStep, withinBound } from './commitment.ts';
export { type Standing, Reputation } from './reputation.ts';
export { AuditSampler, expectedStepsToCatch, stepCatchProbability, stepsToCatch } from './sampling.ts';
export { factorsHash, gradsHash, optimizerHash, weightsHash } from './state.ts';
export {
  cosineSimilarity, type ContributionScore, duplicateGroups, FLAGGED_SCORE, heldOutLoss, heldOutLossAfter, median, type ReplicaGradients,
  scoreContributions,
} from './contribution.ts';
export { recordFlops, type SectionCost, sectionCost, STEP_FLOPS_PER_PARAM } from './flops.ts';
