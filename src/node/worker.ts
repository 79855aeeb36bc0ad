import { multiaddr } from '@multiformats/multiaddr';
import { createNode, type TensorLinkNode } from '../p2p/node.ts';
import { measureCapabilities } from './capabilities.ts';
import { request, serveControl } from './control.ts';
import type { Capabilities } from './vocabulary.ts';

/** How often a worker refreshes its announcement (well inside the validator's 10 s TTL). */
export const ANNOUNCE_INTERVAL_MS = 2_000;

export interface Worker {
  node: TensorLinkNode;
  capabilities: Capabilities;
  stop(): Promise<void>;
}

/**
 * A worker: measures its capabilities, dials its bootstrap validator, announces itself
 * and keeps announcing while alive (a lost validator is retried on the next tick).
 */
export async function startWorker(options: {
  bootstrap: string;
  dataDir?: string;
  listen?: string[];
  memoryBytes?: number;
  onError?: (err: Error) => void;
}): Promise<Worker> {
  const capabilities = measureCapabilities(options.memoryBytes);
  const node = await createNode(options);
  await serveControl(node, {
    capabilities: () => ({ type: 'capabilities', capabilities }),
  });
  const validator = multiaddr(options.bootstrap);
  const announce = async () => {
    await request(node, validator, {
      type: 'announce',
      roles: ['worker'],
      capabilities,
      addrs: node.getMultiaddrs().map(String),
    });
  };
  await announce();
  let stopped = false;
  const timer = setInterval(() => {
    if (!stopped) announce().catch((err: Error) => options.onError?.(err));
  }, ANNOUNCE_INTERVAL_MS);
  return {
    node,
    capabilities,
    stop: async () => {
      stopped = true;
      clearInterval(timer);
      await node.stop();
    },
  };
}
