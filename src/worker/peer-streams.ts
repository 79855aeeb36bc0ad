import type { Libp2p, Stream } from '@libp2p/interface';
import { type DialTarget, dialProtocol, targetName } from '../p2p/index.ts';

/**
 * A worker's long-lived outgoing streams (to the next stage of a chain, to a replica, to a
 * job's owner), one per protocol and peer, opened on first use and dropped when they close.
 * Who may be dialed is decided before this: the job's assignment (JobTable.peerOf) or its owner.
 */
export class PeerStreams {
  private readonly open = new Map<string, Promise<Stream>>();

  constructor(private readonly node: Libp2p) {}

  to(target: DialTarget, protocol: string): Promise<Stream> {
    const key = `${protocol} ${targetName(target)}`;
    let s = this.open.get(key);
    if (!s) {
      s = dialProtocol(this.node, target, protocol);
      this.open.set(key, s);
      s.then((st) => st.addEventListener('close', () => this.open.delete(key))).catch(() => this.open.delete(key));
    }
    return s;
  }
}
