// Issue #33: a node on a public address announces it at once (libp2p 3 held public addresses back until AutoNAT
// verified them, and nothing of ours runs AutoNAT: a validator on a public address listed only 127.0.0.1), and
// `--announce ADDR` adds one it cannot see (its router's). Hosts are namespaces on a switch in 11.0.0.0/24, a
// public range that the switch routes nowhere.
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { after, describe, test } from 'node:test';
import type { Libp2p } from '@libp2p/interface';
import { multiaddr } from '@multiformats/multiaddr';
import { launchNode } from '../../src/swarm/index.ts';
import { createNode, reach } from '../../src/p2p/index.ts';
import { listPeers } from '../../src/user/index.ts';
import { hostMesh } from '../helpers/netns.ts';
import { waitFor } from '../helpers/processes.ts';

describe('public addresses', () => {
  const subnet = `11.${(process.pid % 200) + 20}.7`;
  const mesh = hostMesh(2, { subnet, publicRange: true });
  const children: ChildProcess[] = [];
  let user: Libp2p | undefined;
  after(async () => {
    await user?.stop();
    for (const c of children) c.kill('SIGKILL');
    mesh.remove();
  });

  test('a validator and a worker listening on 0.0.0.0 announce their public addresses at once; --announce adds one', async () => {
    const start = async (h: number, args: string[]) => {
      const n = await launchNode([...args, '--listen', '/ip4/0.0.0.0/tcp/0'], 60_000, { prefix: mesh.hosts[h].exec });
      children.push(n.process);
      return n;
    };
    const validator = await start(0, ['validator']);
    const own = validator.addrs.find((a) => a.startsWith(`/ip4/${mesh.hosts[0].ip}/tcp/`));
    assert.ok(own, `the validator's ready line lists its public address: ${validator.addrs.join(', ')}`);
    const router = `/ip4/${subnet}.200/tcp/4001`;
    const worker = await start(1, ['worker', '--bootstrap', own, '--announce', router]);
    assert.ok(worker.addrs.some((a) => a.startsWith(`/ip4/${mesh.hosts[1].ip}/tcp/`)), worker.addrs.join(', '));
    assert.ok(worker.addrs.some((a) => a.startsWith(`${router}/p2p/`)), `the announced address: ${worker.addrs.join(', ')}`);
    // the registry has the worker at its public addresses, as a user reaching the validator over the switch sees it
    user = await createNode({ listen: [`/ip4/${mesh.rootIp}/tcp/0`] });
    const { value: listed } = await waitFor('the worker in the registry', async () =>
      (await listPeers(user!, multiaddr(own))).find((p) => p.peerId === worker.peerId), 30_000);
    assert.ok(listed.addrs.some((a) => a.includes(`/ip4/${mesh.hosts[1].ip}/tcp/`)), listed.addrs.join(', '));
    assert.ok(listed.addrs.some((a) => a.includes(`${router}`)), listed.addrs.join(', '));
    assert.equal(reach(listed.addrs), 'public', '`status` shows it public');
  });
});
