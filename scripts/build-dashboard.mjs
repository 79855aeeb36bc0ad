// Bundles the dashboard (web/dashboard/: Preact and uPlot, TypeScript) with esbuild into
// dist/dashboard/ (index.html, app.js, app.css), which the validator, `swarm` and `serve` send.
// Run by `npm ci` (prepare), `npm run build` and `npm run build:dashboard`; nothing is fetched at run time.
import { copyFileSync, mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
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
// @noble/hashes (src/browser/twins/node-crypto.ts).
const nodeInTab = {
  name: 'node-in-a-tab',
  setup(b) {
    // modules with a browser twin: Ed25519 by @noble/curves (records are signed in the tab as by any worker), and the
    // contracts' artifacts bundled rather than read from a file
    const twins = { 'src/verify/records/ed25519.ts': 'src/browser/twins/ed25519.ts', 'src/chain/artifacts.ts': 'src/browser/twins/chain-artifacts.ts' };
    b.onResolve({ filter: /^\.\/(ed25519|artifacts)\.ts$/ }, (args) => {
      const resolved = `${args.resolveDir}/${args.path.slice(2)}`.slice(root.length);
      return Object.hasOwn(twins, resolved) ? { path: `${root}${twins[resolved]}` } : undefined;
    });
    // the tab imports our rooms through their entry points (src/tensor/index.ts, src/p2p/index.ts, …): what a bundle
    // uses of one is all it takes of it. Our modules do nothing on import but define (bar the polyfills, and the tab's
    // own globals.ts), so esbuild may leave out those whose exports a bundle never uses.
    b.onResolve({ filter: /^\.\.?\// }, (args) => {
      const path = resolve(args.resolveDir, args.path);
      return path.startsWith(`${root}src/`) && !path.startsWith(`${root}src/browser/`) && !path.endsWith('/polyfills.ts')
        ? { path, sideEffects: false }
        : undefined;
    });
    b.onResolve({ filter: /^node:/ }, (args) => (args.path === 'node:crypto'
      ? { path: `${root}src/browser/twins/node-crypto.ts` }
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
    entryPoints: { app: `${root}src/browser/app.ts`, engine: `${root}src/browser/engine.ts`, serve: `${root}src/browser/serve.ts` },
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
  copyFileSync(`${root}src/browser/index.html`, `${out}/index.html`);
  // onnxruntime-web's WebGPU runtime (src/browser/gpu.ts), served beside the page: nothing from a CDN
  mkdirSync(`${out}/ort`, { recursive: true });
  for (const f of ['ort-wasm-simd-threaded.asyncify.mjs', 'ort-wasm-simd-threaded.asyncify.wasm']) copyFileSync(`${root}node_modules/onnxruntime-web/dist/${f}`, `${out}/ort/${f}`);
  process.stderr.write(`the /lend page${test ? ' (test build)' : ''} bundled into ${out}\n`);
}
