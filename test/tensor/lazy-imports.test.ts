import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ortAvailable } from '../../src/tensor/index.ts';

/**
 * The engine loads no native or network package until it is used: `import('tensorlink/tensor')`
 * of the built package resolves no module of onnxruntime-node (nor koffi's binding to it),
 * libp2p or viem, and `tensorlink/models` none of libp2p or viem. The package is built as
 * `npm run build` compiles it (tsc with tsconfig.build.json, without its type check: the
 * typecheck is npm test's own step) into a folder beside its package.json, and imported by
 * name, through its `exports`, in a child node whose module hooks log every URL resolved;
 * packages loaded by require() are read from require.cache.
 */

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
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

let dir = '';

/** Every module a child node loads for `code` (an ES module run in the package's folder): ESM URLs and require()d files. */
function loaded(code: string): string[] {
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

describe('lazy native and network parts', () => {
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'tl-lazy-'));
    const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
    const build = spawnSync(
      process.execPath,
      [tsc, '-p', 'tsconfig.build.json', '--outDir', join(dir, 'dist'), '--noCheck', '--declaration', 'false', '--sourceMap', 'false'],
      { cwd: ROOT, encoding: 'utf8', timeout: 240_000 },
    );
    assert.equal(build.status, 0, build.stdout + build.stderr);
    copyFileSync(join(ROOT, 'package.json'), join(dir, 'package.json'));
    symlinkSync(join(ROOT, 'node_modules'), join(dir, 'node_modules'), 'dir');
    writeFileSync(join(dir, 'hooks.mjs'), HOOKS);
    writeFileSync(join(dir, 'register.mjs'), REGISTER);
  });

  after(() => rmSync(dir, { recursive: true, force: true }));

  test('the package\'s sub-entries are in its exports', () => {
    const { exports } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { exports: Record<string, { types: string; default: string }> };
    for (const entry of ['tensor', 'models', 'p2p', 'chain']) {
      assert.deepEqual(exports[`./${entry}`], { types: `./dist/${entry}/index.d.ts`, default: `./dist/${entry}/index.js` });
    }
  });

  test('import(\'tensorlink/tensor\') loads no onnxruntime, koffi, libp2p or viem; using ort loads onnxruntime then', () => {
    const urls = loaded(`await import('tensorlink/tensor');`);
    assert.ok(urls.some((u) => u.endsWith('/dist/tensor/index.js')), 'the package was imported by its name');
    assert.deepEqual(urls.filter((u) => NATIVE.test(u) || NETWORK.test(u)), []);
    // the detector sees onnxruntime once a backend needs it (where it loads)
    if (ortAvailable()) {
      const used = loaded(`const t = await import('tensorlink/tensor'); t.setBackend('ort');`);
      assert.ok(used.some((u) => NATIVE.test(u)), 'ort loaded onnxruntime');
    }
  });

  test('import(\'tensorlink/models\') loads no libp2p or viem', () => {
    const urls = loaded(`await import('tensorlink/models');`);
    assert.ok(urls.some((u) => u.endsWith('/dist/models/index.js')));
    assert.deepEqual(urls.filter((u) => NETWORK.test(u)), []);
  });

  test('the network entries do load their packages (the detector sees them)', () => {
    assert.ok(loaded(`await import('tensorlink/p2p');`).some((u) => /node_modules\/libp2p\//.test(u)));
    assert.ok(loaded(`await import('tensorlink/chain');`).some((u) => /node_modules\/viem\//.test(u)));
  });
});
