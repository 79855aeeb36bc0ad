// The validator's queue of checks (re-executions, disputes), as pure logic: bounded in all and per peer, a check asked
// again while it runs waits for that run, and one asked after it ran (a replay) gets its verdict without running again.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CheckQueue } from '../../src/validator/check-queue.ts';

/** A task that ends when told, counting its runs. */
function gate() {
  let open = () => {};
  const ready = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { ready, open: () => open() };
}

describe('the validator\'s check queue', () => {
  test('replays are answered from the first run; unkept verdicts run again; peers and the queue are capped', async () => {
    const queue = new CheckQueue<{ ok: boolean; unavailable?: boolean }>({ running: 1, waiting: 2, perPeer: 2 }, (v) => !v.unavailable);
    let runs = 0;
    const g = gate();
    const slow = () => g.ready.then(() => {
      runs++;
      return { ok: true };
    });
    // the same check twice while it runs: one run
    const [a, b] = [queue.run('alice', 'record-1', slow), queue.run('bob', 'record-1', slow)];
    // alice's second check waits its turn; a third from alice is refused, as is any past the queue's size
    const c = queue.run('alice', 'record-2', async () => {
      runs++;
      return { ok: false };
    });
    await assert.rejects(queue.run('alice', 'record-3', slow), { name: 'RateLimitedError', message: /you have 2 checks waiting/ });
    const d = queue.run('carol', 'record-4', async () => ({ ok: true, unavailable: true }));
    await assert.rejects(queue.run('dave', 'record-5', slow), { name: 'RateLimitedError', message: /has 2 checks waiting/ });
    g.open();
    const values = (await Promise.all([a, b, c, d])).map((r) => r.value);
    assert.deepEqual(values, [{ ok: true }, { ok: true }, { ok: false }, { ok: true, unavailable: true }]);
    assert.deepEqual((await Promise.all([a, b])).map((r) => r.replayed), [false, true], 'the second waited for the first\'s run');
    assert.equal(runs, 2);
    // replayed after it ran: the kept verdict, no run
    assert.deepEqual(await queue.run('eve', 'record-2', slow), { value: { ok: false }, replayed: true });
    assert.equal(runs, 2);
    // a verdict not kept (its worker could not be reached) is asked again
    assert.deepEqual(await queue.run('carol', 'record-4', async () => {
      runs++;
      return { ok: true };
    }), { value: { ok: true }, replayed: false });
    assert.equal(runs, 3);
    assert.equal(queue.replayed, 2);
  });
});
