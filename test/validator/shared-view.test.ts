import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { peerIdFromPrivateKey } from '@libp2p/peer-id';
import { multiaddr } from '@multiformats/multiaddr';
import {
  createLogger, createNode, loadOrCreateIdentity, type PeerRecord, request, serveControl, type TensorLinkNode, Validators,
} from '../../src/p2p/index.ts';
import { Reputation } from '../../src/verify/index.ts';
import { listPeers } from '../../src/user/index.ts';
import { Registry, SharedView, startValidator, type Validator } from '../../src/validator/index.ts';
import { startWorker, type Worker } from '../../src/worker/index.ts';
import { waitFor } from '../helpers/processes.ts';

const addrOf = (v: Validator) => v.node.getMultiaddrs()[0].toString();
const workerIds = (peers: PeerRecord[]) => peers.filter((p) => p.roles.includes('worker')).map((p) => p.peerId).sort();
const validatorIds = (peers: PeerRecord[]) => peers.filter((p) => p.roles.includes('validator')).map((p) => p.peerId).sort();

describe('validators that share one view', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-shared-view-'));
  const validators: Validator[] = [];
  const workers: Worker[] = [];
  let user: TensorLinkNode | null = null;
  after(async () => {
    await user?.stop();
    await Promise.all(workers.map((w) => w.stop()));
    await Promise.all(validators.map((v) => v.stop()));
    rmSync(dir, { recursive: true, force: true });
  });

  test('announcements spread, a validator that joins catches up, a flag by one is applied by all, and a worker or user moves on when its validator is gone', async () => {
    // the set of three: A trusts B and C by id; B dials A; C, started later, dials both; a block needs 2 of 3 signatures
    const [idB, idC] = await Promise.all(['b', 'c'].map(async (d) => peerIdFromPrivateKey(await loadOrCreateIdentity(join(dir, d))).toString()));
    const a = await startValidator({ dataDir: join(dir, 'a'), validators: [idB, idC], threshold: 2 });
    validators.push(a);
    const b = await startValidator({ dataDir: join(dir, 'b'), peers: [addrOf(a)], validators: [idC], threshold: 2 });
    validators.push(b);
    // three workers that were told only of A
    for (let i = 0; i < 3; i++) workers.push(await startWorker({ bootstrap: addrOf(a) }));
    const ids = workers.map((w) => w.node.peerId.toString()).sort();
    // B hears them through A's gossip
    await waitFor('B lists the workers A heard', async () => workerIds(b.peers()).length === 3, 20_000);
    assert.deepEqual(workerIds(b.peers()), ids);

    // A flags a worker (a re-run that failed): B applies the signed flag
    const [cheat] = ids;
    a.reputation.check(cheat, false, 'a forward that re-ran to other bytes', 'record-1');
    await waitFor('B excludes the worker A flagged', async () => b.reputation.excluded(cheat), 10_000);
    assert.match(b.reputation.standing(cheat).reason ?? '', /re-ran to other bytes \(flagged by validator/);

    // C joins: once started, it holds the registry and the flag, before any gossip of its own
    const c = await startValidator({ dataDir: join(dir, 'c'), peers: [addrOf(a), addrOf(b)], threshold: 2 });
    validators.push(c);
    assert.deepEqual(workerIds(c.peers()), ids, 'C read the registry from the validators of its set');
    assert.ok(c.reputation.excluded(cheat), 'C applied the flag it was handed');
    assert.equal(c.peers().find((p) => p.peerId === cheat)?.excluded, true);

    // status on any lists every validator of the set and every worker; a user told of B alone learns of A and C
    user = await createNode();
    const set = Validators.parse(addrOf(b));
    const seen = await listPeers(user, set);
    assert.deepEqual(validatorIds(seen), [a, b, c].map((v) => v.node.peerId.toString()).sort());
    assert.deepEqual(workerIds(seen), ids);
    assert.equal(set.ids().length, 3);

    // a flag is taken only from a validator of the set, and only with its signature
    const forged = { peer: ids[1], reason: 'made up', key: 'k', by: c.node.peerId.toString(), at: Date.now(), sig: 'AAAA' };
    await assert.rejects(request(user, multiaddr(addrOf(a)), { type: 'validator-flag', flag: forged }), { name: 'UnauthorizedError' });
    assert.throws(() => a.shared.apply(forged), { name: 'InvalidMessageError' });
    assert.throws(() => a.shared.apply({ ...forged, by: user!.peerId.toString() }), { name: 'UnauthorizedError' });
    assert.equal(a.reputation.excluded(ids[1]), false);

    // A is gone: the user's requests move on to the next validator, and the workers (told only of A) announce to B or C
    const addrA = addrOf(a);
    const gone = validators.shift()!;
    await gone.stop();
    const after = Date.now();
    assert.deepEqual(workerIds(await listPeers(user, Validators.parse(`${addrA},${addrOf(b)}`))), ids);
    await waitFor('B and C hear every worker after A stopped', async () => [b, c].every((v) => ids.every((id) => {
      const r = v.registry.live().find((p) => p.peerId === id);
      return r !== undefined && r.lastSeen > after + 1_000;
    })), 20_000);
  });

  test('a flag whose push did not reach a validator arrives with its next resync', async () => {
    const log = createLogger({ level: 'silent' });
    const [a, b] = await Promise.all([createNode(), createNode()]);
    try {
      const [idA, idB] = [a.peerId.toString(), b.peerId.toString()];
      const trusts = (peer: string) => peer === idA || peer === idB;
      // A does not reach B (B is not among its peers: the push goes nowhere); B reads A
      const viewOf = (node: TensorLinkNode, peers: Map<string, { target: ReturnType<typeof multiaddr>; alive: boolean }>) => {
        const reputation = new Reputation();
        return { reputation, shared: new SharedView(node, { peers, trusts }, new Registry(log), reputation, log) };
      };
      const atA = viewOf(a, new Map());
      const atB = viewOf(b, new Map([[idA, { target: a.getMultiaddrs()[0], alive: true }]]));
      await serveControl(a, atA.shared.handlers());
      await serveControl(b, atB.shared.handlers());
      const worker = (await createNode().then(async (n) => {
        const id = n.peerId.toString();
        await n.stop();
        return id;
      }));
      atA.reputation.check(worker, false, 'a re-run that differed', 'record-9');
      await new Promise((r) => setTimeout(r, 200));
      assert.equal(atB.reputation.excluded(worker), false, 'the push did not reach B');
      await atB.shared.resync();
      assert.equal(atB.reputation.excluded(worker), true, 'B read it at its resync');
      assert.match(atB.reputation.standing(worker).reason ?? '', /a re-run that differed \(flagged by validator/);
    } finally {
      await Promise.all([a.stop(), b.stop()]);
    }
  });
});
