// Copies every file under src/ that tsc does not emit (the contracts' compiled artifacts, their
// Solidity sources) into the same place under dist/, and stamps the build: bin/tensorlink.js runs
// dist/ only while the stamp is newer than every file under src/. Run by `npm run build` after tsc.
import { copyFileSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const src = join(root, 'src');
const out = process.argv[2] ?? join(root, 'dist');

/** Every file under `dir`, depth first. */
function* files(dir) {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) yield* files(path);
    else if (entry.isFile()) yield path;
  }
}

let copied = 0;
for (const file of files(src)) {
  if (file.endsWith('.ts')) continue;
  const to = join(out, relative(src, file));
  mkdirSync(dirname(to), { recursive: true });
  copyFileSync(file, to);
  copied++;
}
writeFileSync(join(out, '.build-stamp'), `${new Date().toISOString()}\n`);
process.stderr.write(`${copied} files besides the TypeScript copied into ${out}\n`);
