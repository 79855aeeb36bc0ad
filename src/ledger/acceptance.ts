import { InvalidMessageError } from '../errors.ts';
import { bytesSignatureValid, parseRecord, recordId, type RecordSigner, signBytes, type WorkRecord } from '../verify/records/index.ts';

/**
 * A user's acceptance of a worker's record: the user's peer id and its Ed25519 signature over
 * ACCEPT_PREFIX ‖ the record's id. A job's escrow is bound to the user who runs it (its key
 * names the user's peer id), and the validators pay a record from that escrow only when that
 * user accepted it: records anyone else hands in, or a worker hands in for itself, are never
 * paid from another's escrow.
 */
export interface Acceptance {
  user: string;
  /** Base64 Ed25519 signature by the user's identity key over `acceptanceBytes`. */
  sig: string;
}

/** A record as the ledger keeps it: the worker's signed record, and who accepted it (absent: nobody did, and it is never paid). */
export type LedgerRecord = WorkRecord & { by?: Acceptance };

const ACCEPT_PREFIX = 'tensorlink.accept\n';
const MAX_TEXT = 200;

/** The bytes a user signs to accept the record `id`. */
export function acceptanceBytes(id: string): Uint8Array {
  return new TextEncoder().encode(ACCEPT_PREFIX + id);
}

/** The record as accepted by `user` (a new object; the record itself is left as it is). */
export function acceptRecord(record: WorkRecord, user: RecordSigner): LedgerRecord {
  return { ...record, by: { user: user.peer, sig: signBytes(acceptanceBytes(recordId(record)), user) } };
}

/**
 * Whether the record's acceptance is signed by the user it names (`keyOf`: a peer id's raw
 * Ed25519 key, throwing for anything else); true when it has none.
 */
export function acceptanceValid(record: LedgerRecord, keyOf: (peer: string) => Uint8Array): boolean {
  if (!record.by) return true;
  let key: Uint8Array;
  try {
    key = keyOf(record.by.user);
  } catch {
    return false;
  }
  return bytesSignatureValid(acceptanceBytes(recordId(record)), record.by.sig, key);
}

/** What makes a ledger entry distinct: a record may be in the ledger once per user who accepted it (and once unaccepted). */
export function entryKey(record: LedgerRecord): string {
  const id = recordId(record);
  return record.by ? `${id}:${record.by.user}` : id;
}

/** Parses a ledger record from a peer or a file (untrusted): the worker's record, and its acceptance if it has one. */
export function parseLedgerRecord(v: unknown): LedgerRecord {
  const record: LedgerRecord = parseRecord(v);
  const by = (v as { by?: unknown }).by;
  if (by === undefined) return record;
  if (typeof by !== 'object' || by === null || Array.isArray(by)) throw new InvalidMessageError('record.by must be an object {user, sig}');
  const { user, sig } = by as Record<string, unknown>;
  if (typeof user !== 'string' || user.length === 0 || user.length > MAX_TEXT) throw new InvalidMessageError('record.by.user must be a peer id');
  if (typeof sig !== 'string' || sig.length === 0 || sig.length > MAX_TEXT) throw new InvalidMessageError('record.by.sig must be a base64 signature');
  record.by = { user, sig };
  return record;
}
