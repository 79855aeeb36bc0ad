// Bundles the CLI (its entry and everything it imports, packages included) into dist/bundle/, one chunk per command's
// code: a validator's process starts in about half the CPU. bin/fresh-build.js picks dist/bundle/main.js.
//   node scripts/build-bundle.mjs [DIST]         what tsc emitted into DIST (dist/): `npm run build`, after tsc
//   node scripts/build-bundle.mjs --from-src     src/ itself, for `npm test` (scripts/test.mjs): the same code without
//                                                tsc's emit, which the typecheck already covers (test/cli/build.test.ts
//                                                runs the whole `npm run build`)
// Either way each module's `import.meta.url` is the URL its file has in dist/, so the files build-assets.mjs copies
// there (the contracts' artifacts, …) are found, and the installed package moves as one.
import { rmSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundle } from './bundle.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const fromSrc = process.argv.includes('--from-src');
const dist = process.argv.slice(2).find((a) => !a.startsWith('--')) ?? join(root, 'dist');
const outdir = join(dist, 'bundle');
const src = join(root, 'src');
/** Where a module's file is in dist/: itself, or for a source file the .js tsc makes of it. */
const inDist = (path) => (fromSrc ? join(dist, relative(src, path).replace(/\.ts$/, '.js')) : path);

rmSync(outdir, { recursive: true, force: true });
const seconds = await bundle({
  entryPoints: [fromSrc ? join(src, 'cli', 'main.ts') : join(dist, 'cli', 'main.js')],
  outdir,
  under: fromSrc ? src : dist,
  filter: fromSrc ? /\.ts$/ : /\.js$/,
  loader: fromSrc ? 'ts' : 'js',
  // a module's own URL, from the chunk it lands in (all chunks are in dist/bundle/)
  ownUrl: (path) => `new URL(${JSON.stringify(relative(outdir, inDist(path)).split(sep).join('/'))}, import.meta.url).href`,
});
process.stderr.write(`CLI bundled${fromSrc ? ' from src/' : ''} into ${outdir} in ${seconds.toFixed(1)} s\n`);
