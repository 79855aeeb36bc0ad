import { AsyncLocalStorage } from 'node:async_hooks';
import type { Connection, PeerId, Stream } from '@libp2p/interface';

/** What one relayed connection carries, told to its gate: `carry` answers why to cut it, or null to go on. */
export interface RelayCircuit {
  carry(bytes: number): string | null;
  closed(): void;
}

/**
 * Who a relay serves and how much: the peers that may reserve a slot on it, the peers that may be relayed to a peer
 * holding one, and each relayed connection's bytes as they pass (`ip`: the address the peer's connection comes from).
 */
export interface RelayGate {
  mayReserve(peer: string, ip: string | null): boolean;
  mayConnect(from: string, to: string, ip: string | null): boolean;
  circuit(from: string, to: string, ip: string | null): RelayCircuit;
}

/** The IPv4 or IPv6 address a connection comes from (null for one that has none of its own: a relayed or in-memory one). */
export function remoteIp(connection: Pick<Connection, 'remoteAddr'>): string | null {
  const parts = connection.remoteAddr.getComponents();
  if (parts.some((p) => p.name === 'p2p-circuit')) return null;
  const c = parts.find((p) => p.name === 'ip4' || p.name === 'ip6');
  return c?.value ?? null;
}

/** libp2p's connection gater for a relay: reservations and relayed connections as `gate` allows them. */
export function relayGater(gate: RelayGate, ipOf: (peer: PeerId) => string | null) {
  return {
    denyInboundRelayReservation: async (peer: PeerId) => !gate.mayReserve(peer.toString(), ipOf(peer)),
    denyOutboundRelayedConnection: async (from: PeerId, to: PeerId) => !gate.mayConnect(from.toString(), to.toString(), ipOf(from)),
  };
}

/** The parts of libp2p's circuit relay server (@libp2p/circuit-relay-v2 4.x) a meter wraps. */
interface RelayServer {
  handleConnect(args: { connection: Connection; stream: { unwrap(): Stream } }, options: unknown): Promise<void>;
  stopHop(args: { connection: Connection }, options: unknown): Promise<Stream | undefined>;
}

/**
 * Meters every connection a relay carries: each chunk either way is told to its gate's circuit, and the connection is
 * cut (both ends aborted, with the gate's reason) once the gate says so. libp2p's own limits are a fixed size per slot,
 * the same for every source and sent to both ends (which then refuse our protocols on the connection); this meter's are
 * the gate's, per pair, and invisible to the peers until they apply. A connection idle past its time is cut on a timer.
 */
export function meterRelay(server: unknown, gate: RelayGate): () => void {
  const relay = server as RelayServer;
  type Live = { circuit: RelayCircuit; stream: Stream; hop: { unwrap(): Stream }; ended?: boolean };
  // the source's connection and its hop stream (wrapped: the relay unwraps it once it pipes, and again returns it then)
  const source = new AsyncLocalStorage<{ connection: Connection; hop: { unwrap(): Stream }; entry?: Live }>();
  const live = new Set<Live>();
  const handleConnect = relay.handleConnect.bind(relay);
  const stopHop = relay.stopHop.bind(relay);
  // a connect that fails after the destination's stream was opened (the source left before the answer) lets it go
  relay.handleConnect = (args, options) => {
    const context: { connection: Connection; hop: { unwrap(): Stream }; entry?: Live } = { connection: args.connection, hop: args.stream };
    return source.run(context, () => handleConnect(args, options)).catch((err: unknown) => {
      if (context.entry && !context.entry.ended) cut(context.entry, 'the source left before its connection was made');
      throw err;
    });
  };
  // both ends: the destination's stream, and the source's (the relay's pipe would only close it, not reset it)
  const cut = (entry: Live, why: string) => {
    entry.ended = true;
    live.delete(entry);
    entry.circuit.closed();
    const err = new Error(`relay: ${why}`);
    entry.stream.abort(err);
    entry.hop.unwrap().abort(err);
  };
  relay.stopHop = async (args, options) => {
    const stream = await stopHop(args, options);
    const from = source.getStore();
    if (!stream || !from) return stream;
    const circuit = gate.circuit(from.connection.remotePeer.toString(), args.connection.remotePeer.toString(), remoteIp(from.connection));
    const entry: Live = { circuit, stream, hop: from.hop };
    from.entry = entry;
    live.add(entry);
    // towards the source: what the destination sends arrives on this stream; towards the destination: sent on it. A
    // send past the budget throws, so the relay's pipe fails and aborts the source's end too
    stream.addEventListener('message', (evt) => {
      if (entry.ended) return;
      const why = entry.circuit.carry(evt.data.byteLength);
      if (why) cut(entry, why);
    });
    const send = stream.send.bind(stream);
    stream.send = (data) => {
      if (entry.ended) throw new Error('relay: the connection was cut');
      const why = entry.circuit.carry(data.byteLength);
      if (!why) return send(data);
      cut(entry, why);
      throw new Error(`relay: ${why}`);
    };
    stream.addEventListener('close', () => {
      entry.ended = true;
      live.delete(entry);
      entry.circuit.closed();
    }, { once: true });
    return stream;
  };
  const timer = setInterval(() => {
    for (const entry of [...live]) {
      const why = entry.circuit.carry(0);
      if (why) cut(entry, why);
    }
  }, 5_000);
  timer.unref();
  return () => clearInterval(timer);
}
