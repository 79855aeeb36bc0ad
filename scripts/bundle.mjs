// esbuild bundling as the build and the test runner use it: our modules and the packages they import in a few chunks
// (a process then reads a few files instead of about two thousand: libp2p, viem and fastify are most of what a node
// loads), each module's `import.meta.url` kept as the URL of the file it came from, so that every path built from it
// (the contracts' artifacts, the dashboard, fixtures, bin/) is the one the unbundled code reads. Packages with native
// parts or files of their own stay imports.
import { readFileSync } from 'node:fs';
import { resolve, sep } from 'node:path';
import { build } from 'esbuild';

/** Packages that load native libraries, WebAssembly or files beside them, or that start processes of themselves. */
export const EXTERNAL = [
  'onnxruntime-node', 'onnxruntime-common', 'koffi', 'solc', 'tsx', 'tsx/*', 'esbuild', '@foundry-rs/*', 'playwright-core',
  // WebRTC's native part (libdatachannel, a prebuilt binary per platform)
  'node-datachannel', 'node-datachannel/*', '@node-datachannel/*',
  // WebAssembly's text assembler (the tab's GEMM is assembled by it): a file beside itself
  'wabt',
];

/**
 * Bundles `entryPoints` into `outdir` (ESM, split into shared chunks). `ownUrl(path)` gives the JavaScript expression
 * that replaces `import.meta.url` in the module at `path` (ours: under `under`), or null to leave it.
 */
export async function bundle({ entryPoints, outdir, under, filter, loader, ownUrl, absWorkingDir }) {
  const ours = resolve(under) + sep;
  const keepModuleUrls = {
    name: 'keep-module-urls',
    setup(b) {
      b.onLoad({ filter }, ({ path }) => {
        if (!path.startsWith(ours) || path.includes(`${sep}node_modules${sep}`)) return undefined;
        const source = readFileSync(path, 'utf8');
        const url = source.includes('import.meta.url') ? ownUrl(path) : null;
        return { contents: url === null ? source : source.replaceAll('import.meta.url', url), loader };
      });
    },
  };
  const started = Date.now();
  await build({
    entryPoints, outdir, bundle: true, splitting: true, format: 'esm', platform: 'node', target: 'node20',
    external: EXTERNAL, plugins: [keepModuleUrls], logLevel: 'error', legalComments: 'none', absWorkingDir,
    // packages written as CommonJS call require(): give every chunk one
    banner: { js: 'import { createRequire as __tlRequire } from \'node:module\'; const require = __tlRequire(import.meta.url);' },
  });
  return (Date.now() - started) / 1000;
}
