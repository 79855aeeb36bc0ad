// A hosted row's tokens are streamed once: a generation run again from its start (a host caught, its result discarded)
// streams nothing twice, and a token that differs from one already sent ends the row with a typed error.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { VerificationError } from '../../src/errors.ts';
import { streamedOnce } from '../../src/serve/index.ts';

describe('a hosted row\'s stream', () => {
  const logits = new Float32Array(4);

  test('a run again that gives the same tokens streams only those after the ones sent', () => {
    const got: number[] = [];
    const onToken = streamedOnce({ onToken: (t) => got.push(t) });
    [5, 6, 7].forEach((t, i) => onToken(t, 0, logits, i));
    // the second run, from its start: the first three passed over, the rest streamed
    [5, 6, 7, 8, 9].forEach((t, i) => onToken(t, 0, logits, i));
    assert.deepEqual(got, [5, 6, 7, 8, 9]);
  });

  test('a run again that differs from what was sent ends the row: the client is told, not sent a second text', () => {
    const got: number[] = [];
    const onToken = streamedOnce({ onToken: (t) => got.push(t) });
    [5, 6, 7].forEach((t, i) => onToken(t, 0, logits, i));
    onToken(5, 0, logits, 0);
    const named = (err: Error) => err instanceof VerificationError && /token 2 of the 3 streamed/.test(err.message);
    assert.throws(() => onToken(4, 0, logits, 1), named);
    assert.deepEqual(got, [5, 6, 7]);
  });
});
