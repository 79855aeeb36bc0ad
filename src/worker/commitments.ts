import { InvalidArgumentError } from '../errors.ts';
import type { Tensor } from '../tensor/index.ts';
import { ChunkCommitter, closedChunks } from '../verify/index.ts';
import type { Session } from './jobs.ts';

/**
 * The activation commitments a session's step closes (verify/records/commit.ts), base64, for its record; undefined when
 * it closes none. What is committed per row is what the section added to its input over each chunk of COMMIT_CHUNK
 * positions (output − input, when the input is hidden states of the output's shape; the output itself otherwise): the
 * residual stream carries the input's largest values through, so a section that skipped its blocks would otherwise
 * commit nearly what an honest one does. `from` is the step's first cache position.
 * @example
 * const commits = commitStep(session, input, out, position) // on the record: `...(commits ? { commits } : {})`
 */
export function commitStep(session: Session, input: Tensor, out: Tensor, from: number): string | undefined {
  if (out.ndim !== 3 || out.dtype !== 'float32') return undefined;
  const [rows, steps, width] = out.shape;
  const y = out.data as Float32Array;
  let values = y;
  if (input.dtype === 'float32' && input.size === out.size) {
    const x = input.data as Float32Array;
    values = new Float32Array(y.length);
    for (let i = 0; i < y.length; i++) values[i] = y[i] - x[i];
  }
  let committer = session.committer;
  if (!committer || committer.rows !== rows || committer.width !== width) committer = session.committer = new ChunkCommitter(rows, width);
  const proofs = committer.push(values, from, steps);
  // a chunk the session did not compute whole (it began mid-chunk) is not committed, and then no record claims it
  if (proofs.length === 0 || proofs.length !== closedChunks(from, steps).length * rows) return undefined;
  return Buffer.concat(proofs).toString('base64');
}

/**
 * The commitments of a session's last step cut to its first `keep` positions (a speculative pass's accepted ones), for
 * the record re-signed for them; the session's committer forgets the rest (verify/records/commit.ts).
 */
export function truncateCommits(session: Session, from: number, keep: number): string | undefined {
  const committer = session.committer;
  if (!committer) return undefined;
  let proofs: Uint8Array[];
  try {
    proofs = committer.truncate(from + keep);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
  if (proofs.length === 0 || proofs.length !== closedChunks(from, keep).length * committer.rows) return undefined;
  return Buffer.concat(proofs).toString('base64');
}
