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
