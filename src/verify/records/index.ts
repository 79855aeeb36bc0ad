/**
 * The records of verification as pure data: what a worker signs for each computation (its fields, their canonical
 * bytes, its content address), Ed25519 signatures over them, parsing a peer's record and checking it against what the
 * receiver sent and got. No tensor, model or network code: the ledger, the chain and the p2p vocabulary import this
 * room alone, so that they load no ML. The checks that re-run models are `verify/` (its index re-exports these too).
 */
export {
  bytesSignatureValid, checkRecord, type Expectation, parseRecord, RECORD_KINDS, type RecordKind, recordBytes, recordId, type RecordSigner,
  signatureValid, signBytes, signRecord, type WorkFields, type WorkRecord, MAX_RECORD_COMMITS,
} from './record.ts';
export {
  type ChunkCheck, checkChunk, ChunkCommitter, closedChunks, COMMIT_BYTES, COMMIT_CHUNK, COMMIT_PRIME, COMMIT_TOPK, commitChunk,
} from './commit.ts';
