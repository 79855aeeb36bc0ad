import { createHash, randomBytes } from 'node:crypto';
import type { Address, Hex } from 'viem';
import { mnemonicToAccount } from 'viem/accounts';
import { ANVIL_MNEMONIC, deployContracts, escrowKey, NodeChain, RewardTree, startAnvil } from '../src/chain/index.ts';
import { inclusionProblem, type InclusionProof, leafHash, MerkleTree, recordLeaf, signHeader } from '../src/ledger/index.ts';
import { createNode, publicKeyOf, request, signerOf } from '../src/p2p/index.ts';
import { startValidator } from '../src/validator/index.ts';
import { signatureValid, signRecord, type WorkRecord } from '../src/verify/index.ts';
import type { Row } from './gemm.ts';

const H = (c: string) => c.repeat(64);

function records(signer: { peer: string; seed: Uint8Array }, n: number, from = 0): WorkRecord[] {
  return Array.from({ length: n }, (_, i) => signRecord({
    job: 'bench-job', step: from + i, micro: 0, stage: [1, 3], kind: 'forward', input: H('a'), output: H('b'), weights: H('c'),
    backend: 'js', flops: 1_000_000, seq: from + i,
  }, signer));
}

/** Records per second from submissions into co-signed blocks (one validator, loopback), against checking their signatures alone. */
async function ingest(total: number): Promise<Row> {
  const validator = await startValidator();
  const user = await createNode();
  const worker = await createNode();
  try {
    const all = records(signerOf(worker), total);
    const key = publicKeyOf(all[0].peer);
    const t0 = performance.now();
    for (const r of all) signatureValid(r, key);
    const verifyRate = total / ((performance.now() - t0) / 1000);
    const addr = validator.node.getMultiaddrs()[0];
    const start = performance.now();
    const BATCH = 256;
    const batches: WorkRecord[][] = [];
    for (let i = 0; i < total; i += BATCH) batches.push(all.slice(i, i + BATCH));
    // eight submissions in flight at once, as several users' would be
    let next = 0;
    await Promise.all(Array.from({ length: 8 }, async () => {
      while (next < batches.length) await request(user, addr, { type: 'ledger-submit', records: batches[next++] }, 120_000);
    }));
    const rate = total / ((performance.now() - start) / 1000);
    return {
      section: 'ledger', case: `records into blocks (${total} records, one validator, loopback)`, value: rate, unit: 'records/s',
      reference: 'Ed25519 signature checks alone', referenceValue: verifyRate, ratio: rate / verifyRate,
    };
  } finally {
    await user.stop();
    await worker.stop();
    await validator.stop();
  }
}

/** An inclusion proof in a tree of 10⁶ records: its size against the records', its check against re-hashing the tree. */
async function proofs(n: number): Promise<Row[]> {
  const node = await createNode();
  try {
    const signer = signerOf(node);
    const real = records(signer, 1, 0)[0];
    const at = Math.floor(n / 3);
    const leaves = Array.from({ length: n }, (_, i) => (i === at ? recordLeaf(real) : leafHash(randomBytes(32).toString('hex'))));
    const t0 = performance.now();
    const tree = new MerkleTree(leaves);
    const buildMs = performance.now() - t0;
    const header = { height: 0, prev: '', root: tree.root, count: n, time: Date.now() };
    const proof: InclusionProof = { record: real, proof: tree.proof(at), header, signatures: [signHeader(header, signer)] };
    const bytes = Buffer.byteLength(JSON.stringify(proof));
    const signers = { keyOf: publicKeyOf, threshold: 1 };
    const reps = 200;
    const t1 = performance.now();
    for (let i = 0; i < reps; i++) if (inclusionProblem(proof, signers) !== null) throw new Error('the bench proof does not hold');
    const verifyMs = (performance.now() - t1) / reps;
    const recordBytes = Buffer.byteLength(JSON.stringify(real)) * n;
    // what checking without a proof takes: hashing every record's leaf up to the root
    const t2 = performance.now();
    const h = createHash('sha256');
    for (const l of leaves) h.update(l);
    h.digest();
    const naiveMs = performance.now() - t2 + buildMs;
    return [
      {
        section: 'ledger', case: `inclusion proof size, ${n.toExponential(0)} records (${proof.proof.siblings.length} siblings)`, value: bytes, unit: 'bytes',
        reference: 'the records themselves', referenceValue: recordBytes, ratio: bytes / recordBytes,
      },
      {
        section: 'ledger', case: `inclusion proof check, ${n.toExponential(0)} records (record and header signatures, Merkle path)`, value: verifyMs, unit: 'ms',
        reference: 'rebuilding the tree from every record', referenceValue: naiveMs, ratio: verifyMs / naiveMs,
      },
    ];
  } finally {
    await node.stop();
  }
}

/** Gas of one epoch's settlement (10 accounts paid, one job released, one signature) and of one claim, against an ERC-20 transfer. */
async function gas(): Promise<Row[]> {
  const local = await startAnvil();
  try {
    const account = (i: number) => mnemonicToAccount(ANVIL_MNEMONIC, { addressIndex: i });
    const validator = account(1);
    const contracts = await deployContracts(local.rpc, local.chainId, account(0), {
      supply: 10n ** 27n, validators: [validator.address], threshold: 1, unstakeDelay: 3600, refundAfter: 86_400,
    });
    const deployment = { rpc: local.rpc, chainId: local.chainId, contracts };
    const bank = new NodeChain(deployment, account(0));
    const v = new NodeChain(deployment, validator);
    const used = async (hash: Hex) => (await bank.clients.publicClient.getTransactionReceipt({ hash })).gasUsed;
    const transfer = await used(await bank.write('token', 'transfer', [account(2).address, 10n ** 18n]));
    await bank.deposit('bench-job', 'bench-user', 10n ** 21n);
    const rewards = new Map<Address, bigint>(Array.from({ length: 10 }, (_, i) => [account(10 + i).address, BigInt(i + 1) * 10n ** 18n]));
    const tree = new RewardTree(rewards);
    const jobs = [escrowKey('bench-job', 'bench-user')];
    const amounts = [tree.total];
    const digest = await v.read<Hex>('settlement', 'settleDigest', [0n, tree.root, tree.total, jobs, amounts]);
    const settle = await used(await v.write('settlement', 'settle', [0n, tree.root, tree.total, jobs, amounts, [await v.signDigest(digest)]]));
    const who = account(13).address;
    const claim = await used(await bank.write('settlement', 'claim', [0n, who, rewards.get(who)!, tree.proof(who)!]));
    const row = (c: string, g: bigint): Row => ({
      section: 'ledger', case: c, value: Number(g), unit: 'gas', reference: 'an ERC-20 transfer', referenceValue: Number(transfer), ratio: Number(g) / Number(transfer),
    });
    return [row('settlement of an epoch (10 accounts, 1 job released, 1 of 1 signatures)', settle), row('claim of a reward (proof of 4 siblings)', claim)];
  } finally {
    await local.stop();
  }
}

export async function benchLedger(quick: boolean): Promise<Row[]> {
  return [await ingest(quick ? 4096 : 32_768), ...(await proofs(quick ? 100_000 : 1_000_000)), ...(await gas())];
}
