// The conformance suite (suite.ts) on every registered backend that has no file of its own beside this one
// (<name>.test.ts, which the runner runs in parallel with the others): a backend registered without one is still held
// to it. A device backend, or one that cannot be created here, is a skipped test that says why.
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { backendNames } from '../../../src/tensor/index.ts';
import { conformance } from './suite.ts';

const own = new Set(readdirSync(fileURLToPath(new URL('.', import.meta.url))).filter((f) => f.endsWith('.test.ts')).map((f) => f.replace(/\.test\.ts$/, '')));
const others = backendNames().filter((name) => !own.has(name));
for (const name of others) conformance(name);
test(`every registered backend is held to the suite (${backendNames().join(', ')})`, (t) => {
  t.diagnostic(others.length === 0 ? 'each in its own file' : `here: ${others.join(', ')}`);
});
