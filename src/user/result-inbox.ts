import type { Libp2p, Stream } from '@libp2p/interface';
import {
  errorFromWire, type Frame, MAX_RESULT_STREAMS, parseResult, receiveFrames, RequestTable, RESULT_PROTOCOL,
  STAGE_REQUEST_TIMEOUT_MS,
} from '../p2p/index.ts';
import { PeerUnreachableError, UnauthorizedError } from '../errors.ts';
import type { Tensor } from '../tensor/index.ts';
import { hopIn } from '../compress/index.ts';

/** Stages whose result streams are taken though no request of theirs is pending (the least recently named forgotten). */
export const MAX_KNOWN_STAGES = 1_024;

/**
 * Where chained forwards end: the user's side of the result protocol. Results are matched
 * to the request ids it hands out; anything else (a late answer, one nobody asked for) is
 * ignored. Workers send here by the user's peer id, over the connection the user opened.
 */
export class ResultInbox {
  private readonly table = new RequestTable<Frame>('the last stage of the chain');
  /** The chain's records of each request, arrived before its result. */
  private readonly records = new Map<number, unknown[]>();
  /** Who may answer each request: the workers of its chain, no one else. */
  private readonly senders = new Map<number, ReadonlySet<string>>();
  /**
   * Every stage of a chain this user waited on (the newest MAX_KNOWN_STAGES): one may open a result stream when no
   * request of it is pending (a late result, an error for a request already failed over), and is not reset for it. A
   * reset stream it went on to use for the next request, before the reset reached it, would lose that request's result.
   */
  private readonly stages = new Set<string>();

  private constructor() {}

  static async start(node: Libp2p): Promise<ResultInbox> {
    const inbox = new ResultInbox();
    await node.handle(
      RESULT_PROTOCOL,
      (stream: Stream, connection) => {
        const from = connection.remotePeer.toString();
        // only a stage of a chain this user waited on may send results: anyone else's stream is reset before it buffers
        if (!inbox.stages.has(from)) {
          stream.abort(new UnauthorizedError(`${from} is no stage of a request this peer waited on`));
          return;
        }
        // a stage that is done closes its side: this one closes too, so the stream stops counting against the limit
        // (left open, a connection's streams would fill MAX_RESULT_STREAMS and every later result be refused)
        stream.addEventListener('remoteCloseWrite', () => void stream.close().catch(() => stream.abort(new Error('closed'))));
        receiveFrames(stream, (frame) => inbox.deliver(frame, from));
      },
      { maxInboundStreams: MAX_RESULT_STREAMS },
    );
    // a worker of a chain that disconnects (killed, its tab closed) will not pass the request on: fail it now, not at its deadline
    node.addEventListener('peer:disconnect', (evt) => inbox.lost(evt.detail.toString()));
    return inbox;
  }

  /** Fails every request whose chain has `peer` in it. */
  private lost(peer: string): void {
    for (const [id, chain] of this.senders) {
      if (chain.has(peer)) this.table.reject(id, new PeerUnreachableError(`${peer}, a stage of the chain, disconnected`, { details: { peer } }));
    }
  }

  private deliver(frame: Frame, from: string): void {
    const result = parseResult(frame);
    if (!result || !this.table.has(result.id) || !this.senders.get(result.id)?.has(from)) return;
    if (result.kind === 'records') {
      this.records.set(result.id, result.records);
      return;
    }
    this.senders.delete(result.id);
    if (result.kind === 'error') this.table.reject(result.id, errorFromWire(result.message, from));
    else this.table.resolve(result.id, result.frame);
  }

  /**
   * A request id and the promise of its result tensor, with the signed records the chain's
   * stages sent with it (unchecked: the caller checks them), which only the peers in `from`
   * (the chain's workers) may send.
   */
  expect(
    from: ReadonlySet<string>,
    timeoutMs = STAGE_REQUEST_TIMEOUT_MS,
  ): { requestId: number; result: Promise<{ output: Tensor; records: unknown[] }> } {
    const { id, answer } = this.table.open(timeoutMs);
    this.senders.set(id, from);
    for (const peer of from) {
      this.stages.delete(peer);
      this.stages.add(peer);
      if (this.stages.size > MAX_KNOWN_STAGES) this.stages.delete(this.stages.values().next().value as string);
    }
    const result = answer
      .finally(() => this.senders.delete(id))
      // float32, or float16 / int8 when the chain's hops are compressed: its dtype says which
      .then((f) => ({ output: hopIn((f as Frame & { kind: 'tensor' }).tensor), records: this.records.get(id) ?? [] }))
      .finally(() => this.records.delete(id));
    result.catch(() => {});
    return { requestId: id, result };
  }
}
