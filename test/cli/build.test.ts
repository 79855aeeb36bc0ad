import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readDeployment } from '../../src/chain/index.ts';
import { ortAvailable } from '../../src/tensor/index.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** What a clone holds that `npm run build` and `npm pack` read. */
const SOURCES = ['package.json', 'tsconfig.json', 'tsconfig.build.json', 'README.md', 'LICENSE', 'bin', 'scripts', 'src', 'web'];

function run(command: string, args: string[], cwd: string): string {
  const r = spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 240_000 });
  assert.equal(r.status, 0, `${command} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/**
 * Which modules a child node loads: the engine loads no native or network package until it is used, so
 * `import('tensorlink/tensor')` of the installed package resolves no module of onnxruntime-node (nor koffi's binding
 * to it), libp2p or viem, and `tensorlink/models` none of libp2p or viem. The package is imported by name, through its
 * `exports`, in a child node whose module hooks log every URL resolved; packages loaded by require() are read from
 * require.cache.
 */
const NATIVE = /node_modules\/(onnxruntime-node|onnxruntime-common|koffi)\//;
const NETWORK = /node_modules\/(libp2p|@libp2p\/[^/]+|viem)\//;

const HOOKS = `import { appendFileSync } from 'node:fs';
let log;
export function initialize(data) { log = data.log; }
export async function resolve(specifier, context, next) {
  const resolved = await next(specifier, context);
  appendFileSync(log, resolved.url + '\\n');
  return resolved;
}
`;
const REGISTER = `import { register } from 'node:module';
import { pathToFileURL } from 'node:url';
register('./hooks.mjs', pathToFileURL(process.cwd() + '/'), { data: { log: process.env.RESOLVE_LOG } });
`;

/** Every module a child node loads for `code` (an ES module run in the package's folder): ESM URLs and require()d files. */
function loaded(dir: string, code: string): string[] {
  const log = join(dir, `resolved-${Math.random().toString(36).slice(2)}.txt`);
  writeFileSync(log, '');
  const program = `${code}
const { createRequire } = await import('node:module');
process.stdout.write(JSON.stringify(Object.keys(createRequire(process.cwd() + '/').cache)));`;
  const r = spawnSync(process.execPath, ['--import', './register.mjs', '--input-type=module', '-e', program], {
    cwd: dir,
    encoding: 'utf8',
    env: { ...process.env, RESOLVE_LOG: log },
    timeout: 120_000,
  });
  assert.equal(r.status, 0, r.stderr);
  const required = JSON.parse(r.stdout) as string[];
  return [...readFileSync(log, 'utf8').split('\n').filter(Boolean), ...required.map((p) => `file://${p}`)];
}

describe('the package', () => {
  let dir = '';
  /** The packed package, unpacked beside its dependencies: nothing of the checkout. */
  let installed = '';
  let files: string[] = [];

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'tl-build-'));
    const clone = join(dir, 'clone');
    for (const name of SOURCES) cpSync(join(ROOT, name), join(clone, name), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules'), join(clone, 'node_modules'), 'dir');
    run('npm', ['run', 'build', '--silent'], clone);
    const [packed] = JSON.parse(run('npm', ['pack', '--json', '--silent', '--pack-destination', dir], clone)) as { filename: string; files: { path: string }[] }[];
    files = packed.files.map((f) => f.path);
    installed = join(dir, 'installed');
    mkdirSync(installed);
    run('tar', ['-xzf', join(dir, packed.filename), '-C', installed, '--strip-components', '1'], dir);
    symlinkSync(join(ROOT, 'node_modules'), join(installed, 'node_modules'), 'dir');
    writeFileSync(join(installed, 'hooks.mjs'), HOOKS);
    writeFileSync(join(installed, 'register.mjs'), REGISTER);
  });

  after(() => rmSync(dir, { recursive: true, force: true }));

  test('npm run build into a fresh folder, npm pack: the packed CLI deploys the contracts (chain --out)', { timeout: 300_000 }, async () => {
    // what the program reads at run time ships with it; the sources and tests do not
    for (const need of ['bin/tensorlink.js', 'dist/cli/main.js', 'dist/index.js', 'dist/index.d.ts', 'dist/chain/artifacts.json', 'dist/dashboard/index.html', 'dist/dashboard/app.js']) {
      assert.ok(files.includes(need), `the package lacks ${need}`);
    }
    assert.deepEqual(files.filter((f) => f.startsWith('src/') || f.startsWith('test/')), []);
    // nor the /lend page's test build, the one that honours ?fault= (served by nobody: the browser tests route to it),
    // with its second copy of onnxruntime-web's 26 MB of WebAssembly; the page validators serve is there
    assert.deepEqual(files.filter((f) => f.startsWith('dist/lend-test/')), []);
    for (const served of ['index.html', 'app.js', 'engine.js', 'serve.js', 'ort/ort-wasm-simd-threaded.asyncify.mjs', 'ort/ort-wasm-simd-threaded.asyncify.wasm']) {
      assert.ok(files.includes(`dist/lend/${served}`), `the package lacks dist/lend/${served}`);
    }
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
  });

  test('its sub-entries are in its exports', () => {
    const { exports } = JSON.parse(readFileSync(join(installed, 'package.json'), 'utf8')) as { exports: Record<string, { types: string; default: string }> };
    for (const entry of ['tensor', 'models', 'p2p', 'chain']) {
      assert.deepEqual(exports[`./${entry}`], { types: `./dist/${entry}/index.d.ts`, default: `./dist/${entry}/index.js` });
      assert.ok(files.includes(`dist/${entry}/index.js`) && files.includes(`dist/${entry}/index.d.ts`), `the package lacks dist/${entry}`);
    }
  });

  test('import(\'tensorlink/tensor\') loads no onnxruntime, koffi, libp2p or viem; using ort loads onnxruntime then', () => {
    const urls = loaded(installed, `await import('tensorlink/tensor');`);
    assert.ok(urls.some((u) => u.endsWith('/dist/tensor/index.js')), 'the package was imported by its name');
    assert.deepEqual(urls.filter((u) => NATIVE.test(u) || NETWORK.test(u)), []);
    // the detector sees onnxruntime once a backend needs it (where it loads)
    if (ortAvailable()) {
      const used = loaded(installed, `const t = await import('tensorlink/tensor'); t.setBackend('ort');`);
      assert.ok(used.some((u) => NATIVE.test(u)), 'ort loaded onnxruntime');
    }
  });

  test('import(\'tensorlink/models\') loads no libp2p or viem', () => {
    const urls = loaded(installed, `await import('tensorlink/models');`);
    assert.ok(urls.some((u) => u.endsWith('/dist/models/index.js')));
    assert.deepEqual(urls.filter((u) => NETWORK.test(u)), []);
  });

  test('the network entries do load their packages (the detector sees them)', () => {
    assert.ok(loaded(installed, `await import('tensorlink/p2p');`).some((u) => /node_modules\/libp2p\//.test(u)));
    assert.ok(loaded(installed, `await import('tensorlink/chain');`).some((u) => /node_modules\/viem\//.test(u)));
  });
});
