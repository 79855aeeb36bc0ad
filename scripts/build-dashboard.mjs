// Bundles the dashboard (web/dashboard/: Preact and uPlot, TypeScript) with esbuild into
// dist/dashboard/ (index.html, app.js, app.css), which the validator, `swarm` and `serve` send.
// Run by `npm ci` (prepare), `npm run build` and `npm run build:dashboard`; nothing is fetched at run time.
import { copyFileSync, mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const root = fileURLToPath(new URL('..', import.meta.url));
const out = `${root}dist/dashboard`;
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: `${root}web/dashboard/app.tsx` },
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  sourcemap: true,
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outdir: out,
  logLevel: 'warning',
});
copyFileSync(`${root}web/dashboard/index.html`, `${out}/index.html`);
process.stderr.write(`dashboard bundled into ${out}\n`);

// the /lend page: the tab's own libp2p (WebRTC-direct, WebSockets), the control protocol's client and the registry's schema
const lend = `${root}dist/lend`;
mkdirSync(lend, { recursive: true });
await build({
  entryPoints: { app: `${root}web/lend/app.ts` },
  bundle: true,
  format: 'esm',
  platform: 'browser',
  target: 'es2022',
  // the protocol schemas hash with node:crypto; the browser gets SHA-256 from @noble/hashes
  alias: { 'node:crypto': `${root}web/lend/node-crypto.ts` },
  minify: true,
  sourcemap: true,
  outdir: lend,
  logLevel: 'warning',
});
copyFileSync(`${root}web/lend/index.html`, `${lend}/index.html`);
process.stderr.write(`the /lend page bundled into ${lend}\n`);
