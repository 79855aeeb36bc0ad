import { availableParallelism } from 'node:os';
import { createNode, stunServerOf, type TensorLinkNode } from '../p2p/index.ts';
import { getBackend, setBackend } from '../tensor/index.ts';
import { type Flags, type Placement, stringFlag } from './args.ts';
import { type LocalSwarm, localSwarm } from '../swarm/index.ts';

/**
 * Where the user's own node listens (`--listen MULTIADDR`, default 127.0.0.1 on a free port):
 * across machines the last worker of a chain sends results to it, so it must be reachable.
 */
function userListen(flags: Flags): { listen?: string[] } {
  const listen = stringFlag(flags, 'listen');
  return listen ? { listen: [listen] } : {};
}

/** The user's way into a swarm: its node, the validator to ask, and how to leave. */
export interface SwarmAccess {
  node: TensorLinkNode;
  bootstrap: string;
  close(): Promise<void>;
}

/** `--local N`: a local swarm and its user node; `--bootstrap ADDR`: a node of our own (`--listen`) and that validator. */
export async function joinSwarm(where: Exclude<Placement, { kind: 'local' }>, flags: Flags): Promise<SwarmAccess> {
  if (where.kind === 'swarm') {
    const swarm = await startSwarm(where.workers, flags);
    return { node: swarm.user.node, bootstrap: swarm.bootstrap, close: () => swarm.close() };
  }
  // the validator's STUN: behind a NAT, WebRTC to workers behind theirs offers the router's public address to punch through
  const stun = stunServerOf(where.bootstrap.split(',')[0]);
  const node = await createNode({ ...userListen(flags), stun: stun ? [stun] : [] });
  const close = async () => {
    await node.stop();
  };
  return { node, bootstrap: where.bootstrap, close };
}

/**
 * The local swarm of `--local N`: a validator and N workers, each its own process, with this
 * process's backend. The cores are shared out: each worker, and this process, runs
 * onnxruntime on its share with idle threads asleep (unless --threads says otherwise).
 */
export async function startSwarm(
  workers: number, flags: Flags, faults?: (string | undefined)[], chain = false, dashboard?: string,
): Promise<LocalSwarm> {
  const js = getBackend().name === 'js';
  const threads = Math.max(1, Math.floor(availableParallelism() / (workers + 1)));
  if (!js && flags.threads === undefined) setBackend('ort', { threads, spinning: false });
  return localSwarm({ workers, backend: js ? 'js' : undefined, threads, faults, chain, ...(dashboard === undefined ? {} : { dashboard }) });
}

/** Where a local swarm serves its dashboard unless told: port 8080, or any free port when that one is taken (see hostPort). */
export const DEFAULT_DASHBOARD = 'auto';
