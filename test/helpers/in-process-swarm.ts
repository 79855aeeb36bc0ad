import { createNode } from '../../src/p2p/index.ts';
import { startValidator } from '../../src/validator/index.ts';
import { startWorker, type Worker } from '../../src/worker/index.ts';

/** A validator, `workers` workers and a user node in this process, on real libp2p sockets on 127.0.0.1. */
export async function inProcessSwarm(workers: number) {
  const validator = await startValidator();
  const boot = validator.node.getMultiaddrs()[0].toString();
  const list: Worker[] = [];
  for (let i = 0; i < workers; i++) list.push(await startWorker({ bootstrap: boot }));
  const user = await createNode();
  return {
    boot,
    workers: list,
    user,
    stop: async () => {
      await user.stop();
      await Promise.all(list.map((w) => w.stop()));
      await validator.stop();
    },
  };
}
