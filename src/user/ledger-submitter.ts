import type { Libp2p } from '@libp2p/interface';
import { acceptRecord } from '../ledger/index.ts';
import { type DialTarget, request, signerOf, TRAIN_REQUEST_TIMEOUT_MS } from '../p2p/index.ts';
import type { WorkRecord } from '../verify/index.ts';

/** Records one ledger submission carries: about 800 bytes each, well inside a control message. */
export const LEDGER_BATCH = 256;

/**
 * Hands checked records to the validator's ledger without holding the caller up. The validator answers a submission
 * once its records are in a block (a round), so records that come meanwhile wait and go together in the next one: one
 * submission in flight, however fast they come. Each record goes with this user's acceptance (its signature over the
 * record's id): a job's escrow (a hosted model's) is bound to this node's peer id, and pays only the records it
 * accepted. A validator that refuses or cannot be reached is reported by `drain`; nothing else waits for it.
 */
export class LedgerSubmitter {
  /** Records the ledger took. */
  recorded = 0;
  private submitting: Promise<void> = Promise.resolve();
  private unsent: WorkRecord[] = [];
  private sending = false;
  private error: Error | null = null;

  constructor(
    private readonly node: Libp2p,
    private readonly validator: DialTarget,
    /** Told each batch of records the ledger took. */
    private readonly onRecorded?: (count: number) => void,
  ) {}

  submit(records: WorkRecord[]): void {
    if (records.length === 0) return;
    this.unsent = this.unsent.concat(records);
    if (this.sending) return;
    this.sending = true;
    this.submitting = (async () => {
      while (this.unsent.length > 0) {
        const all = this.unsent;
        this.unsent = [];
        await Promise.all(Array.from({ length: Math.ceil(all.length / LEDGER_BATCH) }, async (_, i) => {
          try {
            const user = signerOf(this.node);
            const batch = all.slice(i * LEDGER_BATCH, (i + 1) * LEDGER_BATCH).map((r) => acceptRecord(r, user));
            await request(this.node, this.validator, { type: 'ledger-submit', records: batch }, TRAIN_REQUEST_TIMEOUT_MS);
            this.recorded += batch.length;
            this.onRecorded?.(batch.length);
          } catch (err) {
            this.error ??= err as Error;
          }
        }));
      }
      this.sending = false;
    })();
  }

  /** Waits for the submissions under way; the first that failed, as an error (null: all were taken). */
  async drain(): Promise<Error | null> {
    await this.submitting;
    return this.error;
  }
}
