// Issue #31: where --host-auto places a host's blocks (after Petals' block selection), as pure logic.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { bestStart, blockThroughputs, moveTo, type PlacedSpan } from '../../src/worker/placement.ts';

const span = (peerId: string, start: number, length: number, throughput = 1): PlacedSpan => (
  { peerId, start, end: start + length, throughput }
);

describe('block placement', () => {
  test('a new host takes the weakest window', () => {
    const t = blockThroughputs([span('a', 0, 4), span('b', 2, 4)], 12);
    assert.deepEqual(Array.from(t), [1, 1, 2, 2, 1, 1, 0, 0, 0, 0, 0, 0]);
    assert.equal(bestStart(t, 4), 6);
    assert.equal(bestStart(new Float64Array(12), 3), 0, 'the first of equal windows');
  });

  test('six hosts of three blocks joining one after another cover twelve blocks', () => {
    const spans: PlacedSpan[] = [];
    for (let i = 0; i < 6; i++) spans.push(span(`h${i}`, bestStart(blockThroughputs(spans, 12), 3), 3));
    assert.ok(Array.from(blockThroughputs(spans, 12)).every((x) => x > 0), 'every block has a host');
  });

  test('a hole is filled by a host that can leave its blocks; a move that uncovers a block is never made', () => {
    // 0-3 twice, 4-7 twice, 8-11 lost: a host of a doubled span moves to the hole
    const spans = [span('a', 0, 4), span('b', 0, 4), span('c', 4, 4), span('d', 4, 4)];
    assert.equal(moveTo('a', spans, 12), 8);
    // every block held once: nobody moves (it would uncover its own)
    const single = [span('a', 0, 4), span('c', 4, 4)];
    assert.equal(moveTo('a', single, 12), null);
    assert.equal(moveTo('c', single, 12), null);
  });

  test('a move must raise the weakest block by a third', () => {
    // an even spread (every block at 2): no move raises the weakest block
    const even = [span('a', 0, 6), span('b', 6, 6), span('c', 0, 6), span('d', 6, 6)];
    assert.equal(moveTo('a', even, 12), null);
    // blocks 0-5 at 3, blocks 6-11 at 1: b moving over raises the weakest block from 1 to 2
    const skewed = [span('a', 0, 6, 2), span('b', 0, 6, 1), span('c', 6, 6, 1)];
    assert.equal(moveTo('b', skewed, 12), 6);
  });
});
