// Whether the checkout at `root` has a build that `npm run build` made after the last change
// under src/: then dist/ is the same code, compiled. Read by bin/tensorlink.js and by a local
// swarm started from the sources (src/swarm/local-swarm.ts), so both pick dist/ by one rule.
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

/** The newest modification time of any file under `dir`. */
function newest(dir) {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    latest = Math.max(latest, entry.isDirectory() ? newest(path) : statSync(path).mtimeMs);
  }
  return latest;
}

/**
 * The CLI's entry in the build of `root` if there is one no older than src/ (an installed package has no src/), else
 * null: dist/bundle/main.js (the bundle, which starts a process in less CPU) where the build made one, else
 * dist/cli/main.js.
 */
export function freshBuild(root) {
  const entry = [join(root, 'dist', 'bundle', 'main.js'), join(root, 'dist', 'cli', 'main.js')].find((e) => existsSync(e));
  if (!entry) return null;
  if (!existsSync(join(root, 'src'))) return entry;
  const stamp = join(root, 'dist', '.build-stamp');
  return existsSync(stamp) && statSync(stamp).mtimeMs >= newest(join(root, 'src')) ? entry : null;
}
