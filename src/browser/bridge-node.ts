// The Web Worker's side of the bridge (see bridge-protocol.ts): a node with what TensorLink's worker uses of libp2p
// (handle, dialProtocol, dial, getConnections, getMultiaddrs, listen, stop, peer:disconnect), each done by the page's
// node, and streams whose bytes and events travel through postMessage. Sends wait for the page to have written what
// they gave (SEND_HIGH_WATER bytes in flight at most), so backpressure reaches the engine as it does on Node.
import type { PeerId } from '@libp2p/interface';
import { peerIdFromString } from '@libp2p/peer-id';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import type { ConnectionView, ToPage, ToWorker } from './bridge-protocol.ts';

/** Bytes a stream may have given the page that the page has not yet written to the real stream. */
const SEND_HIGH_WATER = 4 * 2 ** 20;

type Post = (message: ToPage, transfer?: Transferable[]) => void;
type StreamHandler = (stream: BridgedStream, connection: { remotePeer: PeerId; remoteAddr: Multiaddr }) => void;

/** Copies a view into a buffer of its own: structured cloning would copy the whole buffer a view points into. */
function own(data: Uint8Array | { subarray(): Uint8Array }): Uint8Array {
  return (data instanceof Uint8Array ? data : data.subarray()).slice();
}

/** A stream of the page's node, driven from the worker. */
export class BridgedStream extends EventTarget {
  status: 'open' | 'closing' | 'closed' | 'aborted' = 'open';
  private inFlight = 0;
  private drains: { resolve: () => void; reject: (err: Error) => void }[] = [];

  constructor(
    readonly id: number,
    private readonly bridge: BridgeNode,
  ) {
    super();
  }

  send(data: Uint8Array): boolean {
    if (this.status !== 'open') throw new Error(`the stream is ${this.status}`);
    const bytes = own(data);
    this.inFlight += bytes.byteLength;
    this.bridge.post({ t: 'send', stream: this.id, bytes }, [bytes.buffer]);
    return this.inFlight <= SEND_HIGH_WATER;
  }

  onDrain(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.inFlight <= SEND_HIGH_WATER) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject };
      this.drains.push(entry);
      options.signal?.addEventListener('abort', () => {
        this.drains = this.drains.filter((d) => d !== entry);
        reject(options.signal!.reason as Error);
      });
    });
  }

  async close(): Promise<void> {
    if (this.status !== 'open') return;
    this.status = 'closing';
    await this.bridge.call({ t: 'close', call: 0, stream: this.id });
  }

  abort(err: Error): void {
    if (this.status === 'closed' || this.status === 'aborted') return;
    this.bridge.post({ t: 'reset', stream: this.id, reason: err.message });
    this.ended('aborted', err);
  }

  /** Bytes the page wrote to the real stream. */
  written(n: number): void {
    this.inFlight -= n;
    if (this.inFlight > SEND_HIGH_WATER) return;
    for (const d of this.drains.splice(0)) d.resolve();
  }

  arrived(bytes: Uint8Array): void {
    this.dispatchEvent(Object.assign(new Event('message'), { data: bytes }));
  }

  ended(status: 'closed' | 'aborted', err?: Error): void {
    if (this.status === 'closed' || this.status === 'aborted') return;
    this.status = status;
    for (const d of this.drains.splice(0)) d.reject(err ?? new Error('the stream closed'));
    this.bridge.forget(this.id);
    this.dispatchEvent(Object.assign(new Event('close'), { error: err }));
  }
}

/** What startWorker sees as its libp2p node, inside the Web Worker. */
export class BridgeNode extends EventTarget {
  readonly peerId: PeerId;
  private addrs: string[];
  private readonly connections = new Map<string, ConnectionView[]>();
  private readonly handlers = new Map<string, StreamHandler>();
  private readonly streams = new Map<number, BridgedStream>();
  private readonly calls = new Map<number, { resolve: (stream?: number) => void; reject: (err: Error) => void }>();
  private nextCall = 1;
  /** libp2p's transport manager, as src/p2p/node.ts's listenAlso reaches it: a relay slot, /webrtc. */
  readonly components = {
    transportManager: {
      listen: async (addrs: Multiaddr[]) => {
        for (const a of addrs) await this.call({ t: 'listen', call: 0, addr: a.toString() });
      },
    },
  };

  constructor(
    readonly post: Post,
    peerId: string,
    addrs: string[],
  ) {
    super();
    this.peerId = peerIdFromString(peerId);
    this.addrs = addrs;
  }

  /** Sends a request to the page and waits for its reply (a stream's id, for dials). */
  call(message: Extract<ToPage, { call: number }>, signal?: AbortSignal): Promise<number | undefined> {
    const call = this.nextCall++;
    return new Promise((resolve, reject) => {
      this.calls.set(call, { resolve, reject });
      this.post({ ...message, call } as ToPage);
      signal?.addEventListener('abort', () => {
        if (!this.calls.delete(call)) return;
        this.post({ t: 'abort-call', call });
        reject(signal.reason as Error);
      });
    });
  }

  forget(stream: number): void {
    this.streams.delete(stream);
  }

  private stream(id: number): BridgedStream {
    const s = new BridgedStream(id, this);
    this.streams.set(id, s);
    return s;
  }

  /** Everything the page sends. */
  receive(m: ToWorker): void {
    switch (m.t) {
      case 'reply': {
        const pending = this.calls.get(m.call);
        if (!pending) return; // aborted meanwhile: the page closes what it opened
        this.calls.delete(m.call);
        if (m.error !== undefined) pending.reject(Object.assign(new Error(m.error), { name: m.error.split(':')[0] }));
        else {
          if (m.stream !== undefined) this.stream(m.stream);
          pending.resolve(m.stream);
        }
        return;
      }
      case 'inbound': {
        const handler = this.handlers.get(m.protocol);
        const s = this.stream(m.stream);
        if (!handler) s.abort(new Error(`no handler for ${m.protocol}`));
        else handler(s, { remotePeer: peerIdFromString(m.remotePeer), remoteAddr: multiaddr(m.remoteAddr) });
        return;
      }
      case 'data':
        this.streams.get(m.stream)?.arrived(m.bytes);
        return;
      case 'sent':
        this.streams.get(m.stream)?.written(m.bytes);
        return;
      case 'stream-event': {
        const s = this.streams.get(m.stream);
        if (!s) return;
        if (m.event === 'close') s.ended('closed');
        else s.dispatchEvent(new Event('remoteCloseWrite'));
        return;
      }
      case 'peer':
        if (m.connections.length === 0) this.connections.delete(m.peer);
        else this.connections.set(m.peer, m.connections);
        return;
      case 'addrs':
        this.addrs = m.addrs;
        return;
      case 'peer:disconnect':
        this.dispatchEvent(new CustomEvent('peer:disconnect', { detail: peerIdFromString(m.peer) }));
        return;
      case 'start':
        return;
    }
  }

  async handle(protocol: string, handler: StreamHandler, options: { maxInboundStreams?: number } = {}): Promise<void> {
    this.handlers.set(protocol, handler);
    await this.call({ t: 'handle', call: 0, protocol, ...(options.maxInboundStreams ? { maxInboundStreams: options.maxInboundStreams } : {}) });
  }

  async dialProtocol(to: PeerId | Multiaddr | Multiaddr[], protocol: string, options: { signal?: AbortSignal } = {}): Promise<BridgedStream> {
    const id = await this.call({ t: 'dial', call: 0, to: target(to), protocol }, options.signal);
    return this.streams.get(id!)!;
  }

  async dial(to: PeerId | Multiaddr | Multiaddr[], options: { signal?: AbortSignal } = {}): Promise<void> {
    await this.call({ t: 'dial', call: 0, to: target(to) }, options.signal);
  }

  getConnections(peer?: PeerId) {
    const views = peer ? [[peer.toString(), this.connections.get(peer.toString()) ?? []] as const] : [...this.connections];
    return views.flatMap(([p, list]) => list.map((c) => ({
      remotePeer: peerIdFromString(p), remoteAddr: multiaddr(c.remoteAddr), status: c.status, direct: c.direct, limits: c.limited ? {} : undefined,
    })));
  }

  getMultiaddrs(): Multiaddr[] {
    return this.addrs.map((a) => multiaddr(a));
  }

  async stop(): Promise<void> {
    await this.call({ t: 'stop', call: 0 });
  }
}

function target(to: PeerId | Multiaddr | Multiaddr[]): string | string[] {
  return Array.isArray(to) ? to.map(String) : to.toString();
}
