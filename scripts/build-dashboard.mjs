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

// the /lend page: the tab's own libp2p (WebRTC-direct, WebSockets), the control protocol's client and the registry's
// schema (app.js), and TensorLink's engine in a Web Worker (engine.js). What the engine's modules import from Node is not
// called in a tab: each node: module becomes one whose functions say so when called; node:crypto's SHA-256 comes from
// @noble/hashes (web/lend/node-crypto.ts).
const nodeInTab = {
  name: 'node-in-a-tab',
  setup(b) {
    // modules with a browser twin: Ed25519 by @noble/curves (records are signed in the tab as by any worker), and the
    // contracts' artifacts bundled rather than read from a file
    const twins = { 'src/verify/records/ed25519.ts': 'web/lend/ed25519.ts', 'src/chain/artifacts.ts': 'web/lend/chain-artifacts.ts' };
    b.onResolve({ filter: /^\.\/(ed25519|artifacts)\.ts$/ }, (args) => {
      const resolved = `${args.resolveDir}/${args.path.slice(2)}`.slice(root.length);
      return Object.hasOwn(twins, resolved) ? { path: `${root}${twins[resolved]}` } : undefined;
    });
    b.onResolve({ filter: /^node:/ }, (args) => (args.path === 'node:crypto'
      ? { path: `${root}web/lend/node-crypto.ts` }
      : { path: args.path, namespace: 'node-in-a-tab' }));
    b.onLoad({ filter: /.*/, namespace: 'node-in-a-tab' }, (args) => ({
      contents: `module.exports = new Proxy({}, { get: (_, key) => key === '__esModule' ? false : () => { `
        + `throw new Error(${JSON.stringify(args.path)} + '.' + String(key) + ' is not available in a browser tab'); } });`,
      loader: 'js',
    }));
  },
};
// dist/lend/ is what validators serve; dist/lend-test/ (served by nobody, routed to by the browser tests) is the same
// page with its cheating switch (`?fault=`), so that no test-only switch is in the production build.
for (const [dir, test] of [['lend', false], ['lend-test', true]]) {
  const out = `${root}dist/${dir}`;
  mkdirSync(out, { recursive: true });
  await build({
    entryPoints: { app: `${root}web/lend/app.ts`, engine: `${root}web/lend/engine.ts`, serve: `${root}web/lend/serve.ts` },
    bundle: true,
    format: 'esm',
    platform: 'browser',
    target: 'es2022',
    minify: true,
    sourcemap: true,
    define: { 'TENSORLINK_TEST_BUILD': String(test), 'process.env.NODE_ENV': '"production"' },
    plugins: [nodeInTab],
    outdir: out,
    logLevel: 'warning',
  });
  copyFileSync(`${root}web/lend/index.html`, `${out}/index.html`);
  process.stderr.write(`the /lend page${test ? ' (test build)' : ''} bundled into ${out}\n`);
}
