import { readFileSync } from 'node:fs';
import { ARTIFACTS_FILE, type Artifact } from './compile.ts';

/**
 * The committed ABI and bytecode of each contract (a browser tab's build reads the same file, bundled:
 * src/browser/twins/chain-artifacts.ts).
 */
export function artifacts(): Record<string, Artifact> {
  return (JSON.parse(readFileSync(ARTIFACTS_FILE, 'utf8')) as { contracts: Record<string, Artifact> }).contracts;
}
