import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** Our rooms that hold ML or the network: none of them may be among what the ledger or the chain loads. */
const NOT_HERE = new RegExp(
  '^src/(tensor|nn|io|models|data|plan|pipeline|compress|p2p|worker|user|validator|serve|browser|swarm|cli)/|^src/verify/(?!records/)',
);
/** Packages of the engine and the network (the chain's viem is its own business). */
const NOT_PACKAGES = /^(onnxruntime|@libp2p\/|libp2p|@chainsafe\/|@huggingface\/)/;

/** Our modules and the packages that `entry` loads, as esbuild follows its imports. */
async function loads(entry: string): Promise<{ ours: string[]; packages: string[] }> {
  const r = await build({
    entryPoints: [`${ROOT}${entry}`], absWorkingDir: ROOT, bundle: true, platform: 'node', format: 'esm', write: false, metafile: true,
    packages: 'external', logLevel: 'silent',
  });
  const inputs = Object.values(r.metafile.inputs);
  return {
    ours: Object.keys(r.metafile.inputs).filter((p) => p.startsWith('src/')),
    packages: [...new Set(inputs.flatMap((i) => i.imports.filter((x) => x.external && !x.path.startsWith('node:')).map((x) => x.path)))],
  };
}

test('the ledger and the chain load no ML: of ours, only verify/records (and errors.ts); no engine or network package', async () => {
  for (const entry of ['src/verify/records/index.ts', 'src/ledger/index.ts', 'src/chain/index.ts']) {
    const { ours, packages } = await loads(entry);
    assert.ok(ours.includes(entry), `${entry} was not found`);
    assert.deepEqual(ours.filter((p) => NOT_HERE.test(p)), [], `${entry} loads ML or network modules`);
    assert.deepEqual(packages.filter((p) => NOT_PACKAGES.test(p)), [], `${entry} loads engine or network packages`);
  }
  // the records themselves: nothing of ours but errors.ts
  const { ours } = await loads('src/verify/records/index.ts');
  assert.deepEqual(ours.filter((p) => !p.startsWith('src/verify/records/') && p !== 'src/errors.ts'), []);
});
