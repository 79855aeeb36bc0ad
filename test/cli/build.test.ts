import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readDeployment } from '../../src/chain/index.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** What a clone holds that `npm run build` and `npm pack` read. */
const SOURCES = ['package.json', 'tsconfig.json', 'tsconfig.build.json', 'README.md', 'LICENSE', 'bin', 'scripts', 'src', 'web'];

function run(command: string, args: string[], cwd: string): string {
  const r = spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 240_000 });
  assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

test('npm run build into a fresh folder, npm pack: the packed CLI deploys the contracts (chain --out)', { timeout: 300_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tl-build-'));
  try {
    const clone = join(dir, 'clone');
    for (const name of SOURCES) cpSync(join(ROOT, name), join(clone, name), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules'), join(clone, 'node_modules'), 'dir');
    run('npm', ['run', 'build', '--silent'], clone);
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--silent', '--pack-destination', dir], clone)) as { filename: string; files: { path: string }[] }[];
    const files = packed.files.map((f) => f.path);
    // what the program reads at run time ships with it; the sources and tests do not
    for (const need of ['bin/tensorlink.js', 'dist/cli/main.js', 'dist/index.js', 'dist/index.d.ts', 'dist/chain/artifacts.json', 'dist/dashboard/index.html', 'dist/dashboard/app.js']) {
      assert.ok(files.includes(need), `the package lacks ${need}`);
    }
    assert.deepEqual(files.filter((f) => f.startsWith('src/') || f.startsWith('test/')), []);
    // installed: the package's own files and its dependencies, nothing of the checkout
    const installed = join(dir, 'installed');
    mkdirSync(installed);
    run('tar', ['-xzf', join(dir, packed.filename), '-C', installed, '--strip-components', '1'], dir);
    symlinkSync(join(ROOT, 'node_modules'), join(installed, 'node_modules'), 'dir');
    const file = join(dir, 'contracts.json');
    const child = spawn(process.execPath, [join(installed, 'bin', 'tensorlink.js'), 'chain', '--out', file], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    const ready = await new Promise<{ rpc: string; contracts: Record<string, string> }>((resolve, reject) => {
      child.stdout.on('data', (d) => {
        out += d;
        const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
        if (line) resolve(JSON.parse(line));
      });
      child.once('exit', (code) => reject(new Error(`the packed CLI's chain exited ${code}: ${err}`)));
    });
    assert.deepEqual(readDeployment(file).contracts, ready.contracts);
    child.kill('SIGINT');
    await new Promise((resolve) => child.once('exit', resolve));
    assert.equal(JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')).name, 'tensorlink');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
