import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { additionTask, exactMatch, exampleBatch, loadTextFile, reverseTask, taskBatch, textBatch } from '../../src/data/index.ts';
import { Generator } from '../../src/tensor/index.ts';

const chars = { encode: (s: string) => [...s].map((ch) => ch.charCodeAt(0)) };

describe('data', () => {
  test('addition: every 2-digit sum once, held-out examples never in training, answers exact', () => {
    const task = additionTask({ seed: 3 });
    assert.equal(task.train.length + task.test.length, 10000);
    const train = new Set(task.train.map((e) => e.prompt));
    assert.ok(task.test.every((e) => !train.has(e.prompt)));
    for (const e of [...task.test.slice(0, 50), ...task.train.slice(0, 50)]) {
      const [a, b] = e.prompt.slice(0, -1).split('+').map(Number);
      assert.equal(e.answer, String(a + b));
    }
    assert.deepEqual(additionTask({ seed: 3 }).test, task.test, 'seeded split');
  });

  test('reverse: answers are the reversed words', () => {
    const task = reverseTask({ seed: 1, count: 300, testSize: 50 });
    for (const e of task.test) assert.equal(e.answer, [...e.prompt.slice(0, -1)].reverse().join(''));
  });

  test('task batches score only the answer and its terminator', () => {
    const batch = exampleBatch([{ prompt: '1+2=', answer: '3' }, { prompt: '10+20=', answer: '30' }], '\n', chars, 0);
    const [b, t] = batch.input.shape;
    assert.deepEqual([b, t], [2, 8]);
    const row = (r: number) => Array.from(batch.target.data.subarray(r * t, (r + 1) * t));
    assert.deepEqual(row(0), [-100, -100, -100, 51, 10, -100, -100, -100]);
    assert.deepEqual(row(1), [-100, -100, -100, -100, -100, 51, 48, 10]);
    const a = taskBatch(additionTask(), chars, new Generator(5), 4, 0);
    const c = taskBatch(additionTask(), chars, new Generator(5), 4, 0);
    assert.deepEqual(a.input.data, c.input.data, 'seeded batches repeat');
  });

  test('text windows are shifted by one token, seeded; missing files are typed errors', () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-text-'));
    writeFileSync(join(dir, 'a.txt'), 'abcdefghijklmnopqrstuvwxyz'.repeat(10));
    const data = loadTextFile(join(dir, 'a.txt'), chars);
    assert.equal(data.train.length + data.heldOut.length, 260);
    const batch = textBatch(data.train, new Generator(1), 3, 8);
    for (let r = 0; r < 3; r++) {
      for (let i = 0; i < 7; i++) assert.equal(batch.target.data[r * 8 + i], batch.input.data[r * 8 + i + 1]);
    }
    assert.throws(() => loadTextFile(join(dir, 'none.txt'), chars), { name: 'FileNotFoundError' });
    assert.throws(() => textBatch(data.train.subarray(0, 5), new Generator(1), 1, 8), { name: 'InvalidArgumentError' });
  });

  test('exact match counts only identical answers', () => {
    assert.equal(exactMatch(['57', '12', ''], ['57', '13', '']), 2 / 3);
  });
});
