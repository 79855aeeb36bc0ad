import { readFileSync, writeFileSync } from 'node:fs';
import { type BlockHeader, inclusionProblem, type InclusionProof } from '../../ledger/index.ts';
import { recordId } from '../../verify/index.ts';
import { createNode, publicKeyOf, request } from '../../p2p/index.ts';
import { InvalidArgumentError, VerificationError } from '../../errors.ts';
import { type Flags, intFlag, optionalIntFlag, requiredString, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';
import { tokens } from './nodes.ts';
import { validatorsFlag } from './node-process.ts';

/** An answer without the control protocol's envelope (its type and request id). */
function withoutEnvelope(a: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(a).filter(([k]) => k !== 'type' && k !== 'id'));
}

/** Asks the validator at `--bootstrap` one ledger question. */
async function ask(flags: Flags, message: Record<string, unknown>, timeoutMs = 30_000): Promise<Record<string, unknown>> {
  const target = validatorsFlag(requiredString(flags, 'bootstrap'));
  const node = await createNode();
  try {
    return await request(node, target, message, timeoutMs);
  } finally {
    await node.stop();
  }
}

/** `ledger show [--height N]`: the ledger's head and each worker's accepted work, or one block's header, signers and records. */
async function show(flags: Flags, out: Output): Promise<void> {
  const height = optionalIntFlag(flags, 'height', 0);
  const a = await ask(flags, { type: 'ledger-show', ...(height === undefined ? {} : { height }) });
  const answer = withoutEnvelope(a);
  if (height !== undefined) {
    type Row = { id: string; peer: string; kind: string; step: number; micro: number; flops: number };
    const b = answer.block as { header: BlockHeader; hash: string; signatures: string[]; records: Row[] };
    const lines = [
      `block ${b.header.height}  hash ${b.hash}  root ${b.header.root}  ${b.header.count} records  ${new Date(b.header.time).toISOString()}`,
      `signed by ${b.signatures.join(', ')}`,
      ...b.records.map((r) => `  ${r.id.slice(0, 16)}…  ${r.peer.slice(-8)}  ${r.kind} ${r.step}:${r.micro}  ${r.flops.toExponential(2)} FLOPs`),
    ];
    out.result(answer, lines.join('\n'));
    return;
  }
  const work = (answer.work ?? {}) as Record<string, { records: number; flops: number }>;
  const lines = [
    `${answer.height} blocks, ${answer.records} records, ${answer.pending} pending; head ${String(answer.hash).slice(0, 16)}…; blocks need ${answer.threshold} signatures`,
    ...Object.entries(work).map(([peer, w]) => `  ${peer}  ${w.records} records  ${w.flops.toExponential(3)} FLOPs`),
  ];
  out.result(answer, lines.join('\n'));
}

/** `ledger proof RECORD-ID [--out FILE]`: the record's inclusion proof, for `ledger verify`. */
async function proofCommand(flags: Flags, out: Output, id: string | undefined): Promise<void> {
  if (!id || !/^[0-9a-f]{64}$/.test(id)) throw new UsageError('ledger proof needs a RECORD-ID (64 hex digits, as `ledger show --height N` lists them)');
  const a = await ask(flags, { type: 'ledger-proof', record: id });
  const file = stringFlag(flags, 'out');
  const text = `${JSON.stringify(a.proof, null, 2)}\n`;
  if (file) {
    writeFileSync(file, text);
    out.info(`the proof of ${id} is in ${file}; check it with: tensorlink ledger verify ${file}`);
  } else process.stdout.write(text);
}

/**
 * `tensorlink ledger verify PROOF-FILE`: checks offline that a record is in the ledger. The
 * record must be signed by its worker (its key is in its peer id), its path must lead to the
 * block header's Merkle root, and the header must carry `--threshold` validators' signatures
 * (of `--validators` only, when given). Exit 0 and a line saying so, or exit 1 and why not.
 */
export async function ledgerCommand(flags: Flags, out: Output, positionals: string[] = []): Promise<void> {
  const [sub, file] = positionals;
  if (sub === 'show') return show(flags, out);
  if (sub === 'proof') return proofCommand(flags, out, file);
  if (sub === 'settle') return settle(flags, out);
  if (sub !== 'verify') throw new UsageError(`ledger ${sub ?? ''}: say 'ledger show', 'ledger proof RECORD-ID', 'ledger verify PROOF-FILE' or 'ledger settle'`);
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

/** `ledger settle`: the validators close the epoch and post its reward root on the chain. */
async function settle(flags: Flags, out: Output): Promise<void> {
  const a = await ask(flags, { type: 'ledger-settle' }, 120_000);
  const answer = withoutEnvelope(a);
  const rewards = (answer.rewards ?? {}) as Record<string, string>;
  const lines = [
    `epoch ${answer.epoch} settled: root ${String(answer.root)}, ${Object.keys(rewards).length} accounts paid`,
    ...Object.entries(rewards).map(([account, amount]) => `  ${account}  ${tokens(amount)} (${amount} units)`),
  ];
  out.result(answer, lines.join('\n'));
}
