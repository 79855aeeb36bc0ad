import '../polyfills.ts';
import { identify } from '@libp2p/identify';
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

export type TensorLinkNode = Libp2p<{ identify: ReturnType<ReturnType<typeof identify>>; ping: ReturnType<ReturnType<typeof ping>> }>;

/**
 * A libp2p node with TensorLink's stack: TCP, noise encryption, yamux multiplexing,
 * identify and ping. (The DHT, gossip and bootstrap come with the roles, issue 4.)
 */
export async function createNode(options: NodeOptions = {}): Promise<TensorLinkNode> {
  const privateKey: PrivateKey | undefined = options.dataDir ? await loadOrCreateIdentity(options.dataDir) : undefined;
  const node = await createLibp2p({
    ...(privateKey ? { privateKey } : {}),
    addresses: { listen: options.listen ?? ['/ip4/127.0.0.1/tcp/0'] },
    transports: [tcp()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: { identify: identify(), ping: ping() },
  });
  return node as unknown as TensorLinkNode;
}
