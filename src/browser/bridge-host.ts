// The page's side of the bridge (see bridge-protocol.ts): the tab's libp2p node does what the Web Worker's node asks
// (handle a protocol, dial, listen, stop) and carries its streams: bytes both ways, each send acknowledged once the real
// stream took it, and the streams' ends; its connections, addresses and lost peers are reported as they change.
import type { Connection, Libp2p, PeerId, Stream } from '@libp2p/interface';
import { peerIdFromString } from '@libp2p/peer-id';
import { multiaddr } from '@multiformats/multiaddr';
import type { ConnectionView, ToPage, ToWorker } from './bridge-protocol.ts';

/** Connects `worker` (running bridge-node.ts) to `node`; what the bridge does not carry goes to `onMessage`. */
export function hostBridge(worker: Worker, node: Libp2p, onMessage: (m: ToPage) => void): void {
  const post = (m: ToWorker, transfer: Transferable[] = []) => worker.postMessage(m, transfer);
  const streams = new Map<number, { stream: Stream; writing: Promise<void> }>();
  const aborts = new Map<number, AbortController>();
  let nextStream = 1;
  const carry = (stream: Stream): number => {
    const id = nextStream++;
    streams.set(id, { stream, writing: Promise.resolve() });
    stream.addEventListener('message', (evt) => {
      const bytes = evt.data.subarray().slice();
      post({ t: 'data', stream: id, bytes }, [bytes.buffer]);
    });
    stream.addEventListener('remoteCloseWrite', () => post({ t: 'stream-event', stream: id, event: 'remoteCloseWrite' }));
    stream.addEventListener('close', () => {
      streams.delete(id);
      post({ t: 'stream-event', stream: id, event: 'close' });
    });
    return id;
  };
  const views = (peer: PeerId): ConnectionView[] => node.getConnections(peer).map((c: Connection) => ({
    remoteAddr: c.remoteAddr.toString(), status: c.status, direct: c.direct, limited: c.limits != null,
  }));
  const report = (peer: PeerId) => post({ t: 'peer', peer: peer.toString(), connections: views(peer) });
  node.addEventListener('connection:open', (evt) => report(evt.detail.remotePeer));
  node.addEventListener('connection:close', (evt) => report(evt.detail.remotePeer));
  node.addEventListener('peer:disconnect', (evt) => post({ t: 'peer:disconnect', peer: evt.detail.toString() }));
  const addrs = () => post({ t: 'addrs', addrs: node.getMultiaddrs().map(String) });
  node.addEventListener('self:peer:update', addrs);
  for (const c of node.getConnections()) report(c.remotePeer);

  const reply = (call: number, work: (signal: AbortSignal) => Promise<number | undefined>) => {
    const ctl = new AbortController();
    aborts.set(call, ctl);
    work(ctl.signal).then(
      (stream) => post({ t: 'reply', call, ...(stream !== undefined ? { stream } : {}) }),
      (err: Error) => post({ t: 'reply', call, error: `${err.name}: ${err.message}` }),
    ).finally(() => aborts.delete(call));
  };
  worker.addEventListener('message', (evt: MessageEvent<ToPage>) => {
    const m = evt.data;
    switch (m.t) {
      case 'handle':
        reply(m.call, async () => {
          await node.handle(m.protocol, (stream, connection) => {
            const id = carry(stream);
            post({ t: 'inbound', stream: id, protocol: m.protocol, remotePeer: connection.remotePeer.toString(), remoteAddr: connection.remoteAddr.toString() });
          }, m.maxInboundStreams ? { maxInboundStreams: m.maxInboundStreams } : {});
          return undefined;
        });
        return;
      case 'dial': {
        const to = Array.isArray(m.to) ? m.to.map((a) => multiaddr(a)) : m.to.startsWith('/') ? multiaddr(m.to) : peerIdFromString(m.to);
        reply(m.call, async (signal) => {
          if (m.protocol === undefined) {
            await node.dial(to, { signal });
            return undefined;
          }
          const stream = await node.dialProtocol(to, m.protocol, { signal });
          // the worker gave up meanwhile: nobody will use it
          if (signal.aborted) {
            stream.abort(new Error('the dial was abandoned'));
            throw new Error('the dial was abandoned');
          }
          return carry(stream);
        });
        return;
      }
      case 'abort-call':
        aborts.get(m.call)?.abort(new Error('abandoned by the worker'));
        return;
      case 'listen':
        reply(m.call, async () => {
          const manager = (node as unknown as { components: { transportManager: { listen(a: unknown[]): Promise<void> } } }).components.transportManager;
          await manager.listen([multiaddr(m.addr)]);
          addrs();
          return undefined;
        });
        return;
      case 'send': {
        const s = streams.get(m.stream);
        if (!s) return;
        const bytes = m.bytes;
        s.writing = s.writing.then(async () => {
          if (!s.stream.send(bytes)) await s.stream.onDrain();
          post({ t: 'sent', stream: m.stream, bytes: bytes.byteLength });
        }).catch(() => {});
        return;
      }
      case 'close': {
        const s = streams.get(m.stream);
        reply(m.call, async () => {
          if (s) {
            await s.writing;
            await s.stream.close();
          }
          return undefined;
        });
        return;
      }
      case 'reset':
        streams.get(m.stream)?.stream.abort(new Error(m.reason));
        streams.delete(m.stream);
        return;
      case 'stop':
        reply(m.call, async () => {
          await node.stop();
          return undefined;
        });
        return;
      default:
        onMessage(m);
    }
  });
}
