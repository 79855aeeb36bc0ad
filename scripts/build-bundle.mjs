// Bundles the built CLI (dist/cli/main.js and everything it imports, packages included) into dist/bundle/, one
// chunk per command's code: a validator's process starts in about half the CPU. bin/fresh-build.js picks
// dist/bundle/main.js. Run by `npm run build` after tsc (it bundles what tsc emitted).
import { rmSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundle } from './bundle.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = process.argv[2] ?? join(root, 'dist');
const outdir = join(dist, 'bundle');

rmSync(outdir, { recursive: true, force: true });
const seconds = await bundle({
  entryPoints: [join(dist, 'cli', 'main.js')], outdir, under: dist, filter: /\.js$/, loader: 'js',
  // a module's own URL, from the chunk it lands in (all chunks are in dist/bundle/): the installed package moves as one
  ownUrl: (path) => `new URL(${JSON.stringify(relative(outdir, path).split(sep).join('/'))}, import.meta.url).href`,
});
process.stderr.write(`CLI bundled into ${outdir} in ${seconds.toFixed(1)} s\n`);
