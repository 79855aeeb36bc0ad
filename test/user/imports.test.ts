import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

const DIR = fileURLToPath(new URL('../../src/user/', import.meta.url));
/** File size past which a file of src/user is no longer one a reader holds at once (issue 28). */
const MAX_LINES = 450;

/** The files of src/user that each file imports or re-exports from (type-only imports count: they tie the files together too). */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of readdirSync(DIR).filter((f) => f.endsWith('.ts'))) {
    const text = readFileSync(`${DIR}${file}`, 'utf8');
    const from = [...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+'\.\/([^']+)'/gms)];
    const bare = [...text.matchAll(/^\s*import\s+'\.\/([^']+)'/gm)];
    const targets = [...from, ...bare].map((m) => m[1]);
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/** A cycle in `graph` as the files along it (first = last), or null when it has none. */
function findCycle(graph: Map<string, string[]>): string[] | null {
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (file: string): string[] | null => {
    if (state.get(file) === 'done') return null;
    if (state.get(file) === 'open') return [...path.slice(path.indexOf(file)), file];
    state.set(file, 'open');
    path.push(file);
    for (const next of graph.get(file) ?? []) {
      const cycle = visit(next);
      if (cycle) return cycle;
    }
    path.pop();
    state.set(file, 'done');
    return null;
  };
  for (const file of graph.keys()) {
    const cycle = visit(file);
    if (cycle) return cycle;
  }
  return null;
}

describe('src/user: one direction', () => {
  test('the finder finds a cycle, and its absence', () => {
    assert.deepEqual(findCycle(new Map([['a.ts', ['b.ts']], ['b.ts', ['c.ts']], ['c.ts', ['a.ts']]])), ['a.ts', 'b.ts', 'c.ts', 'a.ts']);
    assert.equal(findCycle(new Map([['a.ts', ['b.ts', 'c.ts']], ['b.ts', ['c.ts']], ['c.ts', []]])), null);
  });

  test('the relative imports of src/user/*.ts (type-only ones too) form no cycle', () => {
    const graph = importGraph();
    assert.ok(graph.get('job.ts')?.includes('placement.ts'), 'the parser sees job.ts import its parts');
    assert.ok(graph.get('failover.ts')?.includes('job-stage.ts'), 'the parser sees type-only imports');
    const cycle = findCycle(graph);
    assert.equal(cycle, null, `an import cycle: ${cycle?.join(' → ')}`);
  });

  test(`no file of src/user is over ${MAX_LINES} lines`, () => {
    const long = readdirSync(DIR)
      .filter((f) => f.endsWith('.ts'))
      .map((f) => ({ f, lines: readFileSync(`${DIR}${f}`, 'utf8').split('\n').length }))
      .filter(({ lines }) => lines > MAX_LINES);
    assert.deepEqual(long, []);
  });
});
