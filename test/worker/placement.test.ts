// Issue #31: where --host-auto places a host's blocks (after Petals' block selection), as pure logic.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { bestStart, blockThroughputs, moveTo, type PlacedSpan, reachableStarts, routableWindow } from '../../src/worker/placement.ts';

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

  // Issue #50: the router uses a host's span whole, so a span that begins where no route arrives serves nobody. The
  // simulation (src/sim/) found it: with hosts of uneven lengths at their weakest windows, every block held and no route
  // through an 80-block model.
  test('reachableStarts: the boundaries a route reaches from block 0 through spans used whole', () => {
    assert.deepEqual(reachableStarts([span('a', 0, 4), span('b', 2, 4), span('c', 4, 4)], 12), [0, 4, 8]);
    assert.deepEqual(reachableStarts([span('a', 0, 12)], 12), [0], 'the model\'s end is no start');
    assert.deepEqual(reachableStarts([], 12), [0]);
  });

  test('a joining host takes the weakest window that a route reaches, cut at the model\'s end', () => {
    // a holds 0-4; b holds 3-7, where no route arrives (a ends at 5)
    const spans = [span('a', 0, 5), span('b', 3, 5)];
    const t = blockThroughputs(spans, 10);
    assert.equal(bestStart(t, 4), 6, 'the weakest window: after b, where no route reaches');
    assert.deepEqual(routableWindow(t, 4, spans), { start: 5, length: 4 });
    // from the only boundary left, a host of four takes the two blocks there are
    assert.deepEqual(routableWindow(blockThroughputs([span('a', 0, 8)], 10), 4, [span('a', 0, 8)]), { start: 8, length: 2 });
  });

  test('hosts of uneven lengths joining at routable windows leave a route through the model; at their weakest windows they may not', () => {
    const lengths = [5, 3, 7, 4, 6, 2, 5, 3];
    const join = (at: (spans: PlacedSpan[], length: number) => { start: number; length: number }) => {
      const spans: PlacedSpan[] = [];
      lengths.forEach((n, i) => {
        const w = at(spans, n);
        spans.push(span(`h${i}`, w.start, w.length));
      });
      return spans;
    };
    const routable = join((spans, n) => routableWindow(blockThroughputs(spans, 20), n, spans));
    const weakest = join((spans, n) => ({ start: bestStart(blockThroughputs(spans, 20), n), length: n }));
    const routeEnds = (spans: PlacedSpan[]) => spans.some((s) => s.end === 20 && reachableStarts(spans, 20).includes(s.start));
    assert.ok(Array.from(blockThroughputs(weakest, 20)).every((x) => x > 0), 'at their weakest windows every block is held');
    assert.equal(routeEnds(weakest), false, 'and no route reaches the end');
    assert.ok(routeEnds(routable), 'at routable windows a route does');
  });

  test('a move goes only where a route reaches; where none does, the host stays', () => {
    // a and b hold 0-3; c 4-7; 8-11 unheld: b may move to 8 (a route reaches it through a and c)
    assert.equal(moveTo('b', [span('a', 0, 4), span('b', 0, 4), span('c', 4, 4)], 12), 8);
    // a and b hold 0-3, c 4-8; 9-11 unheld: b's weakest window starts at 8, where no route arrives, and from 9 (where
    // one does) its four blocks do not fit: it stays
    const spans = [span('a', 0, 4), span('b', 0, 4), span('c', 4, 5)];
    assert.equal(bestStart(blockThroughputs([spans[0], spans[2]], 12), 4), 8);
    assert.equal(moveTo('b', spans, 12), null);
  });
});
