// The tab's worker, in a Web Worker (the page stays responsive while sections compute): TensorLink's startWorker on a
// node bridged to the page's libp2p (bridge-node.ts), the js backend, the tab's key to sign records with. Posts what
// it serves to the page every second.
import './globals.ts';
import { gemmNN, jsBackend, jsBackendWith, setBackend } from '../tensor/index.ts';
import type { TensorLinkNode } from '../p2p/index.ts';
import { privateKeyToAccount } from 'viem/accounts';
import { MIN_STAKE, NodeChain } from '../chain/index.ts';
import { startWorker } from '../worker/index.ts';
import { BridgeNode } from './bridge-node.ts';
import { openTabGpu } from './gpu.ts';
import { computeOnTabGpu } from './gpu-runner.ts';
import type { StartMessage, ToPage, ToWorker, WorkSnapshot } from './bridge-protocol.ts';

/** How often the page's view of the tab's account is read from the chain. */
const CHAIN_READ_MS = 5_000;

const post = (m: ToPage, transfer: Transferable[] = []) => postMessage(m, { transfer });
let bridge: BridgeNode | null = null;

async function start(s: StartMessage): Promise<void> {
  // browser-wasm: the js backend as it is (its GEMM the WebAssembly module); browser-js: with the TypeScript GEMM
  setBackend(s.engine === 'js' ? jsBackendWith(gemmNN) : jsBackend);
  // browser-webgpu: a session's steps run as graphs on the GPU (gpu-runner.ts); the rest (training) on the js backend
  if (s.engine === 'webgpu') {
    const gpu = await openTabGpu();
    if (typeof gpu === 'string') throw new Error(gpu);
    computeOnTabGpu(gpu);
  }
  bridge = new BridgeNode(post, s.peerId, s.addrs);
  // on a chain: its account stakes what it holds (a worker without stake is given no work) and claims what it earns
  const chain = s.chain ? new NodeChain(s.chain.deployment, privateKeyToAccount(s.chain.key)) : null;
  const worker = await startWorker({
    ...(chain ? { chain } : {}),
    bootstrap: s.validator,
    memoryBytes: s.memoryBytes,
    announceVia: 'direct',
    ...(s.fault ? { fault: s.fault } : {}),
    own: {
      node: bridge as unknown as TensorLinkNode,
      signer: { peer: s.peerId, seed: s.seed },
      capabilities: s.capabilities,
      circuit: `${s.validator}/p2p-circuit`,
    },
  });
  post({ t: 'started' });
  let held: WorkSnapshot['chain'];
  const readChain = async () => {
    if (!chain) return;
    const account = chain.address;
    try {
      const [stake, tokens, gas, claimed] = await Promise.all([chain.stakeOf(), chain.balanceOf(), chain.gasOf(), chain.claimedBy(account)]);
      held = { account, stake: String(stake), minStake: String(MIN_STAKE), tokens: String(tokens), gas: String(gas), claimed: String(claimed) };
    } catch (err) {
      held = { account, error: (err as Error).message };
    }
  };
  await readChain();
  // four reads (a log scan among them): often enough for a page, not for every announcement
  if (chain) setInterval(() => void readChain(), CHAIN_READ_MS);
  setInterval(() => {
    const sections = [...worker.jobs.values()].flatMap((j) => (j.section
      ? [{
          job: j.jobId, arch: j.section.model.config.arch, range: j.section.range, format: j.section.held.format,
          bytes: j.section.held.bytes, sessions: j.section.sessions.size,
        }]
      : []));
    const m = worker.memory.report();
    post({ t: 'snapshot', snapshot: { sections, work: worker.stages.work(), memory: { used: m.used, total: m.total }, ...(held ? { chain: held } : {}) } });
  }, 1_000);
}

onmessage = (evt: MessageEvent<ToWorker>) => {
  const m = evt.data;
  if (m.t === 'start') start(m.start).catch((err: unknown) => post({ t: 'failed', message: (err as Error).message }));
  else bridge?.receive(m);
};
