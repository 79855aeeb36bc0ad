// The messages between the page and the Web Worker that computes a tab's sections. Chrome has no RTCPeerConnection in
// Web Workers, so the tab's libp2p node lives in the page; the worker runs TensorLink's worker (startWorker: jobs,
// sections, records) on a node that forwards what it does to the page's (bridge-node.ts) and gets its streams' bytes
// and events back (bridge-host.ts).
import type { Deployment } from '../chain/index.ts';
import type { Capabilities } from '../p2p/index.ts';
import type { Fault } from '../worker/index.ts';

/** A connection of the page's node, as the worker sees it (what src/p2p/webrtc.ts reads). */
export interface ConnectionView {
  remoteAddr: string;
  status: string;
  direct: boolean;
  limited: boolean;
}

/** Worker → page. */
export type ToPage
  = | { t: 'handle'; call: number; protocol: string; maxInboundStreams?: number }
    | { t: 'dial'; call: number; to: string | string[]; protocol?: string }
    | { t: 'abort-call'; call: number }
    | { t: 'listen'; call: number; addr: string }
    | { t: 'send'; stream: number; bytes: Uint8Array }
    | { t: 'close'; call: number; stream: number }
    | { t: 'reset'; stream: number; reason: string }
    | { t: 'stop'; call: number }
    | { t: 'snapshot'; snapshot: WorkSnapshot }
    | { t: 'started' }
    | { t: 'failed'; message: string };

/** Page → worker. */
export type ToWorker
  = | { t: 'start'; start: StartMessage }
    | { t: 'reply'; call: number; stream?: number; error?: string }
    | { t: 'inbound'; stream: number; protocol: string; remotePeer: string; remoteAddr: string }
    | { t: 'data'; stream: number; bytes: Uint8Array }
    | { t: 'sent'; stream: number; bytes: number }
    | { t: 'stream-event'; stream: number; event: 'remoteCloseWrite' | 'close' }
    | { t: 'peer'; peer: string; connections: ConnectionView[] }
    | { t: 'addrs'; addrs: string[] }
    | { t: 'peer:disconnect'; peer: string };

export interface StartMessage {
  peerId: string;
  /** The 32-byte seed of the tab's Ed25519 key: the worker signs records with it. */
  seed: Uint8Array;
  validator: string;
  memoryBytes: number;
  /** The js backend, or the js backend with its GEMM in WebAssembly (the same bits), or the tab's GPU (browser-webgpu). */
  engine: 'js' | 'wasm' | 'webgpu';
  capabilities: Capabilities;
  addrs: string[];
  fault?: Fault;
  /** The chain the swarm settles on, and the tab's account key: it stakes, and claims what it earns. */
  chain?: { deployment: Deployment; key: `0x${string}` };
}

/** What the page shows of the worker's work (posted every second). */
export interface WorkSnapshot {
  sections: { job: string; arch: string; range: [number, number]; format: string; bytes: number; sessions: number }[];
  work: { forwards: number; trainForwards: number; trainBackwards: number; optimizerSteps: number; weightBytesReceived: number };
  memory: { used: number; total: number };
  /** On a chain: the tab's account and what it holds (wei, as decimal strings), or why they could not be read. */
  chain?: { account: string; stake: string; minStake: string; tokens: string; gas: string; claimed: string } | { account: string; error: string };
}
