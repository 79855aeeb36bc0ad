// Compiles src/chain/contracts/*.sol into src/chain/artifacts.json (run after changing a contract: npm run contracts).
import { writeFileSync } from 'node:fs';
import { ARTIFACTS_FILE, compileContracts } from '../src/chain/compile.ts';

const out = compileContracts();
writeFileSync(ARTIFACTS_FILE, `${JSON.stringify(out, null, 1)}\n`);
console.log(`compiled ${Object.keys(out.contracts).join(', ')} with solc ${out.version} into ${ARTIFACTS_FILE}`);
