// What a validator keeps for commitment checks (src/validator/sections.ts): session prefills are bounded by count, by
// bytes and by idle time, least recently used first; checks of one session run one at a time, in the order they came.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KVCache } from '../../src/models/index.ts';
import { MAX_SESSION_PREFILLS, SESSION_PREFILL_BYTES, SESSION_PREFILL_IDLE_MS, SessionPrefills } from '../../src/validator/sections.ts';
import type { SessionPrefill } from '../../src/verify/index.ts';

const prefill = (bytes: number): SessionPrefill => ({
  cache: new KVCache(1), steps: 1, position: 1, sent: [], open: null, rows: 1, width: 1, bytes,
});

test('session prefills: the least recently used leave past the count or the bytes; an idle one expires', () => {
  const s = new SessionPrefills();
  for (let i = 0; i <= MAX_SESSION_PREFILLS; i++) s.set(`k${i}`, prefill(1), 0);
  assert.equal(s.size, MAX_SESSION_PREFILLS);
  assert.equal(s.get('k0', 0), undefined, 'the oldest left');
  assert.ok(s.get('k1', 0), 'read: now the most recent');
  s.set('big', prefill(SESSION_PREFILL_BYTES), 0);
  assert.ok(s.get('big', 0), 'the one just kept stays, alone if need be');
  assert.equal(s.size, 1, 'the others left for its bytes');
  assert.equal(s.get('big', SESSION_PREFILL_IDLE_MS + 1), undefined, 'idle too long');
});

test('checks of one session run one at a time, in the order they came; a failed one does not stop the next', async () => {
  const s = new SessionPrefills();
  const order: string[] = [];
  const slow = (name: string, ms: number, fail = false) => () => new Promise<string>((resolve, reject) => setTimeout(() => {
    order.push(name);
    if (fail) reject(new Error(name));
    else resolve(name);
  }, ms));
  const a = s.serial('x', slow('a', 30, true));
  const b = s.serial('x', slow('b', 1));
  const c = s.serial('y', slow('c', 1));
  await assert.rejects(a, /a/);
  assert.equal(await b, 'b');
  assert.equal(await c, 'c');
  assert.deepEqual(order, ['c', 'a', 'b'], 'another session does not wait; the same one does');
});
