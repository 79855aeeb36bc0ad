import { readFileSync } from 'node:fs';
import { inclusionProblem, type InclusionProof } from '../../ledger/index.ts';
import { recordId } from '../../verify/index.ts';
import { publicKeyOf } from '../../p2p/index.ts';
import { InvalidArgumentError, VerificationError } from '../../errors.ts';
import { type Flags, intFlag, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';

export const ledgerOptions = {
  threshold: { type: 'string' },
  validators: { type: 'string' },
} as const;

/**
 * `tensorlink ledger verify PROOF-FILE`: checks offline that a record is in the ledger. The
 * record must be signed by its worker (its key is in its peer id), its path must lead to the
 * block header's Merkle root, and the header must carry `--threshold` validators' signatures
 * (of `--validators` only, when given). Exit 0 and a line saying so, or exit 1 and why not.
 */
export async function ledgerCommand(flags: Flags, out: Output, positionals: string[] = []): Promise<void> {
  const [sub, file] = positionals;
  if (sub !== 'verify') {
    throw new UsageError(`ledger ${sub ?? ''}: only 'ledger verify PROOF-FILE' is available in this version (show, proof and settle come with the ledger service)`);
  }
  if (!file) throw new UsageError('ledger verify needs a PROOF-FILE');
  let proof: InclusionProof;
  try {
    proof = JSON.parse(readFileSync(file, 'utf8')) as InclusionProof;
  } catch (err) {
    throw new InvalidArgumentError(`cannot read the proof ${file}: ${(err as Error).message}`);
  }
  const threshold = intFlag(flags, 'threshold', 1);
  const list = stringFlag(flags, 'validators');
  const signers = { keyOf: publicKeyOf, threshold, ...(list ? { validators: new Set(list.split(',').map((v) => v.trim())) } : {}) };
  const problem = inclusionProblem(proof, signers);
  if (problem) throw new VerificationError(`the proof does not hold: ${problem}`);
  const { header, record } = proof;
  const summary = { valid: true, record: recordId(record), height: header.height, root: header.root, signatures: proof.signatures.length };
  const what = `${record.kind} ${record.step}:${record.micro} of job ${record.job}`;
  out.result(summary, `valid: the record of ${record.peer} (${what}) is in block ${header.height}, root ${header.root.slice(0, 16)}…, `
  + `signed by ${threshold} or more validators`);
}
