#!/usr/bin/env node
// The `tensorlink` command: runs the built CLI (dist/) when it is there and no older than the
// TypeScript sources (an installed package ships no src/), else the sources through tsx (a
// development checkout after `npm ci`, or one edited since its last `npm run build`).
import { existsSync, readdirSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const built = new URL('../dist/cli/main.js', import.meta.url);
const stamp = fileURLToPath(new URL('../dist/.build-stamp', import.meta.url));
const sources = fileURLToPath(new URL('../src', import.meta.url));

/** The newest modification time of any file under `dir`. */
function newest(dir) {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = `${dir}/${entry.name}`;
    latest = Math.max(latest, entry.isDirectory() ? newest(path) : statSync(path).mtimeMs);
  }
  return latest;
}

const fresh = existsSync(built) && (!existsSync(sources) || (existsSync(stamp) && statSync(stamp).mtimeMs >= newest(sources)));
if (fresh) {
  await import(built.href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(new URL('../src/cli/main.ts', import.meta.url).href);
}
