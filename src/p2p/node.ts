import '../polyfills.ts';
import { gossipsub } from '@libp2p/gossipsub';
import { identify } from '@libp2p/identify';
import { kadDHT, passthroughMapper } from '@libp2p/kad-dht';
import type { Libp2p, PrivateKey } from '@libp2p/interface';
import { noise } from '@libp2p/noise';
import { ping } from '@libp2p/ping';
import { tcp } from '@libp2p/tcp';
import { yamux } from '@libp2p/yamux';
import { createLibp2p } from 'libp2p';
import { loadOrCreateIdentity } from './identity.ts';

export interface NodeOptions {
  /** Where the identity (and later other state) lives; omitted: a fresh identity per run. */
  dataDir?: string;
  /** Listen addresses (default: a free TCP port on 127.0.0.1). */
  listen?: string[];
}

/** TensorLink's own DHT: peers of the public libp2p DHT are not ours to query. */
export const DHT_PROTOCOL = '/tensorlink/kad/1.0.0';

export type TensorLinkNode = Libp2p<{
  identify: ReturnType<ReturnType<typeof identify>>;
  ping: ReturnType<ReturnType<typeof ping>>;
  dht: ReturnType<ReturnType<typeof kadDHT>>;
  pubsub: ReturnType<ReturnType<typeof gossipsub>>;
}>;

/**
 * A libp2p node with TensorLink's stack: TCP, noise encryption, yamux multiplexing,
 * identify, ping, a Kademlia DHT (server mode, private addresses kept) and gossipsub.
 */
export async function createNode(options: NodeOptions = {}): Promise<TensorLinkNode> {
  const privateKey: PrivateKey | undefined = options.dataDir ? await loadOrCreateIdentity(options.dataDir) : undefined;
  const node = await createLibp2p({
    ...(privateKey ? { privateKey } : {}),
    addresses: { listen: options.listen ?? ['/ip4/127.0.0.1/tcp/0'] },
    transports: [tcp()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: {
      identify: identify(),
      ping: ping(),
      // Loopback and LAN addresses are what a local or home swarm has: keep them (the default drops them).
      dht: kadDHT({ protocol: DHT_PROTOCOL, clientMode: false, peerInfoMapper: passthroughMapper }),
      // A worker alone with its validator still publishes (the validator may not be in its mesh yet).
      pubsub: gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: false }),
    },
  });
  return node as unknown as TensorLinkNode;
}
