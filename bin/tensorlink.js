#!/usr/bin/env node
// The `tensorlink` command: runs the built CLI (dist/) when present, else the
// TypeScript sources through tsx (a development checkout after `npm ci`).
import { existsSync } from 'node:fs';

const built = new URL('../dist/cli/main.js', import.meta.url);
if (existsSync(built)) {
  await import(built.href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  await import(new URL('../src/cli/main.ts', import.meta.url).href);
}
