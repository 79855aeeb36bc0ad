// Issues #31 and #50: the registry at 10,000 hosts. A validator takes 10,000 workers' announcements (in-process
// announcers: the registry's own entry point, as its announce handler calls it), each hosting a span of one of two
// models; a real user node reads the whole registry and the model index a page at a time over libp2p (no page, nor any
// entry of one, grows with the swarm: a model of 10,000 hosts comes as entries of MODEL_HOSTS_PER_ENTRY), and routes a
// session over them (its time printed, not asserted).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createNode, MODEL_HOSTS_PER_ENTRY, PAGE_BYTES, PAGE_ITEMS, parseAnnounce, request } from '../../src/p2p/index.ts';
import { allModels, listModels, listPeers, routeOver } from '../../src/user/index.ts';
import { startValidator } from '../../src/validator/index.ts';

const HOSTS = 10_000;
const BLOCKS = 80;

describe('the registry at 10,000 hosts', () => {
  test('status and the model index come in pages of bounded size; a route over 10,000 hosts', async () => {
    // the registry's clock held still: no record expires (PEER_TTL_MS) however long a loaded machine takes to read them
    const validator = await startValidator({ registryClock: () => 0 });
    const user = await createNode();
    try {
      const hash = (i: number) => i.toString(16).padStart(64, '0');
      for (let i = 0; i < HOSTS; i++) {
        // every worker hosts a span of model-0, every other one a span of model-1 too; spans of 1 to 8 blocks at every
        // offset, so a route has many choices
        const width = 1 + (i % 8);
        const first = (i * 7) % (BLOCKS - width + 1);
        const proximity = Object.fromEntries(Array.from({ length: 4 }, (_, k) => [`12D3KooWpeer${String((i + k + 1) % HOSTS).padStart(6, '0')}`, { rttMs: 1 + k, mbps: 100, measuredAt: 1 }]));
        validator.registry.record(`12D3KooWpeer${String(i).padStart(6, '0')}`, parseAnnounce({
          roles: ['worker'],
          capabilities: { memoryBytes: 2 ** 34, gflops: 10 + (i % 50), tier: 'C', cores: 8, backend: 'ort' },
          addrs: [`/ip4/10.0.${i >> 8}.${i & 255}/tcp/4001`],
          proximity,
          hosts: [0, 1].filter((m) => m === 0 || i % 2 === 1).map((m) => ({
            name: `model-${m}`, hash: hash(m + 1), blocks: BLOCKS, layers: [first, first + width - 1], format: 'int4', state: 'online', freeTokens: 4096,
          })),
        }));
      }
      const boot = validator.node.getMultiaddrs()[0];
      let started = performance.now();
      const peers = await listPeers(user, boot);
      const statusMs = performance.now() - started;
      assert.equal(peers.length, HOSTS + 1, 'every worker and the validator');
      assert.equal(new Set(peers.map((p) => p.peerId)).size, HOSTS + 1, 'no peer twice across pages');
      // status a page at a time (`status --page N`): each page bounded, the cursors covering every peer once
      const paged: string[] = [];
      for (let page: number | undefined = 0; page !== undefined;) {
        const answer = await request(user, boot, { type: 'status', page });
        const peersOfPage = answer.peers as { peerId: string }[];
        assert.ok(peersOfPage.length <= PAGE_ITEMS && JSON.stringify(peersOfPage).length <= PAGE_BYTES);
        paged.push(...peersOfPage.map((p) => p.peerId));
        page = answer.next as number | undefined;
      }
      assert.deepEqual(paged, peers.map((p) => p.peerId));
      // the model index: a model's hosts in entries of at most MODEL_HOSTS_PER_ENTRY, merged by the reader
      let pages = 0;
      for (let page: number | undefined = 0; page !== undefined; pages++) {
        const answer = await listModels(user, boot, page);
        assert.ok(answer.models.every((m) => m.hosts.length <= MODEL_HOSTS_PER_ENTRY));
        assert.ok(JSON.stringify(answer.models).length <= PAGE_BYTES);
        page = answer.next;
      }
      const models = await allModels(user, boot);
      assert.equal(models.length, 2);
      assert.deepEqual(models.map((m) => m.hosts.length), [HOSTS, HOSTS / 2]);
      assert.ok(models.every((m) => m.complete), 'every block of every model is served');
      assert.equal(new Set(models[0].hosts.map((h) => h.peerId)).size, HOSTS, 'no host twice across entries');
      const first = { models };
      // a route over every block of the model all 10,000 workers host, timed
      const model = first.models[0];
      // timed from scratch each time, the best of five (the first also compiles the code: reported apart)
      const times: number[] = [];
      let route = null;
      for (let i = 0; i < 5; i++) {
        started = performance.now();
        route = routeOver(model, peers, { tokens: 2048 });
        times.push(performance.now() - started);
      }
      const routeMs = Math.min(...times);
      assert.ok(route);
      // the route covers every block once, in order
      let next = 0;
      for (const hop of route) {
        assert.equal(hop.layers[0], next);
        next = hop.layers[1] + 1;
      }
      assert.equal(next, BLOCKS);
      process.stderr.write(`${HOSTS} hosts: status in ${Math.ceil(peers.length / PAGE_ITEMS)}+ pages took ${statusMs.toFixed(0)} ms; the index in ${pages} pages; `
        + `a route of ${route.length} hops over ${model.hosts.length} hosts of ${model.name} took ${routeMs.toFixed(2)} ms (the first call ${times[0].toFixed(2)} ms)\n`);
    } finally {
      await user.stop();
      await validator.stop();
    }
  });
});
