// The tab as a worker: its own libp2p node (WebRTC-direct and WebSockets to Node peers, WebRTC signalled through the
// validator's relay to anyone, the relay itself as the fallback) carries TensorLink's worker, the same startWorker as
// the CLI's, running in a Web Worker with the key the tab keeps in IndexedDB and the memory the visitor lends. The js
// backend computes, so a validator re-runs its records bit for bit; on the tab's GPU (browser-webgpu) its inference
// steps run as graphs there, and a validator compares them within onnxruntime's tolerance.
import { circuitRelayTransport } from '@libp2p/circuit-relay-v2';
import { identify } from '@libp2p/identify';
import type { Libp2p, PrivateKey } from '@libp2p/interface';
import { noise } from '@libp2p/noise';
import { ping } from '@libp2p/ping';
import { webRTC, webRTCDirect } from '@libp2p/webrtc';
import { webSockets } from '@libp2p/websockets';
import { yamux } from '@libp2p/yamux';
import type { Multiaddr } from '@multiformats/multiaddr';
import { createLibp2p } from 'libp2p';
import { tierOf } from '../p2p/index.ts';
import type { Fault } from '../worker/index.ts';
import { hostBridge } from './bridge-host.ts';
import type { StartMessage, ToWorker, WorkSnapshot } from './bridge-protocol.ts';

/** The tab's libp2p: it dials only what `denyDial` lets through (the swarm's hosts). */
export async function tabNode(key: PrivateKey, denyDial: (ma: Multiaddr) => boolean): Promise<Libp2p> {
  return createLibp2p({
    privateKey: key,
    // a relay slot on the validator and /webrtc over it: how Node peers and other tabs reach a tab
    addresses: { listen: [] },
    transports: [webRTCDirect(), webSockets(), webRTC(), circuitRelayTransport()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: { identify: identify(), ping: ping() },
    connectionGater: { denyDialMultiaddr: denyDial },
  });
}

export interface Lending {
  /** The memory lent, in bytes; the engine (the js backend, with its GEMM in WebAssembly, or the GPU) and its measured speed. */
  memoryBytes: number;
  engine: StartMessage['engine'];
  gflops: number;
  /** The address of the validator the tab is connected to (its relay). */
  validator: Multiaddr;
  /** Cheat on purpose: test builds only (TENSORLINK_TEST_BUILD), to show a validator catches a tab that cheats. */
  fault?: Fault;
  /** The swarm's chain and the tab's account key (see StartMessage). */
  chain?: StartMessage['chain'];
}

/** The tab's worker as the page sees it: the latest report of its work. */
export interface TabWorker {
  snapshot: WorkSnapshot | null;
  /** What it computes on, as it announces it: browser-webgpu, browser-wasm or browser-js. */
  backend: string;
  node: Libp2p;
  /** Why the Web Worker stopped, if it did. */
  failed?: string;
}

/**
 * Starts the tab's worker: startWorker runs in a Web Worker (serve.ts) on a node bridged to this page's (bridge-host.ts),
 * so it announces itself, takes a slot on the validator's relay and serves sections while the page stays responsive.
 */
export async function lend(node: Libp2p, key: PrivateKey, lending: Lending): Promise<TabWorker> {
  const capabilities = {
    memoryBytes: lending.memoryBytes,
    gflops: Math.round(lending.gflops * 10) / 10,
    tier: tierOf(lending.gflops),
    cores: navigator.hardwareConcurrency || 1,
    backend: `browser-${lending.engine}`,
  };
  const worker = new Worker(new URL('serve.js', import.meta.url), { type: 'module' });
  const tab: TabWorker = { snapshot: null, node, backend: capabilities.backend };
  const started = resolvers();
  hostBridge(worker, node, (m) => {
    if (m.t === 'snapshot') tab.snapshot = m.snapshot;
    else if (m.t === 'started') started.resolve();
    else if (m.t === 'failed') started.reject(new Error(m.message));
  });
  worker.addEventListener('error', (evt) => {
    const err = new Error(`the tab's worker failed: ${evt.message}`);
    started.reject(err);
    // a worker that died (out of memory, say) serves nothing: its peers must know now, and fail its jobs over
    tab.failed = err.message;
    for (const c of node.getConnections()) c.abort(err);
  });
  const start: StartMessage = {
    peerId: node.peerId.toString(), seed: key.raw.slice(0, 32), engine: lending.engine, validator: lending.validator.toString(), memoryBytes: lending.memoryBytes,
    capabilities, addrs: node.getMultiaddrs().map(String), ...(lending.fault ? { fault: lending.fault } : {}),
    ...(lending.chain ? { chain: lending.chain } : {}),
  };
  worker.postMessage({ t: 'start', start } satisfies ToWorker);
  await started.promise;
  return tab;
}

/** Promise.withResolvers, which the browsers of 2023 lack. */
function resolvers(): { promise: Promise<void>; resolve: () => void; reject: (err: Error) => void } {
  const out = {} as { promise: Promise<void>; resolve: () => void; reject: (err: Error) => void };
  out.promise = new Promise<void>((resolve, reject) => {
    out.resolve = resolve;
    out.reject = reject;
  });
  return out;
}
