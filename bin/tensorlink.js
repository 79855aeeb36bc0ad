#!/usr/bin/env node
// The `tensorlink` command: runs the built CLI (dist/) when it is there and no older than the
// TypeScript sources (an installed package ships no src/), else the sources through tsx (a
// development checkout after `npm ci`, or one edited since its last `npm run build`).
import { pathToFileURL, fileURLToPath } from 'node:url';
import { freshBuild } from './fresh-build.js';

const built = freshBuild(fileURLToPath(new URL('..', import.meta.url)));
if (built) {
  await import(pathToFileURL(built).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(new URL('../src/cli/main.ts', import.meta.url).href);
}
