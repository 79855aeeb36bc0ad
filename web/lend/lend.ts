// The tab as a worker: its own libp2p node (WebRTC-direct and WebSockets to Node peers, WebRTC signalled through the
// validator's relay to anyone, the relay itself as the fallback) runs TensorLink's worker, the same startWorker as the
// CLI's, with the key the tab keeps in IndexedDB and the memory the visitor lends. The js backend computes, so a
// validator re-runs its records bit for bit.
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
import type { TensorLinkNode } from '../../src/p2p/node.ts';
import { tierOf } from '../../src/p2p/vocabulary.ts';
import { setBackend } from '../../src/tensor/index.ts';
import type { Fault } from '../../src/worker/fault.ts';
import { startWorker, type Worker } from '../../src/worker/worker.ts';

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
  /** The memory lent, in bytes; the engine's measured speed. */
  memoryBytes: number;
  gflops: number;
  /** The address of the validator the tab is connected to (its relay). */
  validator: Multiaddr;
  /** Cheat on purpose: test builds only (TENSORLINK_TEST_BUILD), to show a validator catches a tab that cheats. */
  fault?: Fault;
}

/** Starts the tab's worker on `node`: it announces itself, takes a slot on the validator's relay and serves sections. */
export async function lend(node: Libp2p, key: PrivateKey, lending: Lending): Promise<Worker> {
  setBackend('js');
  const capabilities = {
    memoryBytes: lending.memoryBytes,
    gflops: Math.round(lending.gflops * 10) / 10,
    tier: tierOf(lending.gflops),
    cores: navigator.hardwareConcurrency || 1,
    backend: 'browser-js',
  };
  const bootstrap = lending.validator.toString();
  return startWorker({
    bootstrap,
    memoryBytes: lending.memoryBytes,
    announceVia: 'direct',
    ...(lending.fault ? { fault: lending.fault } : {}),
    own: {
      node: node as unknown as TensorLinkNode,
      signer: { peer: node.peerId.toString(), seed: key.raw.subarray(0, 32) },
      capabilities,
      circuit: `${bootstrap}/p2p-circuit`,
    },
  });
}
