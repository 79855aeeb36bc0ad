import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TensorLinkError } from '../errors.ts';

/** Where the Solidity sources live, and the committed artifacts compiled from them. */
export const CONTRACTS_DIR = join(dirname(fileURLToPath(import.meta.url)), 'contracts');
export const ARTIFACTS_FILE = join(dirname(fileURLToPath(import.meta.url)), 'artifacts.json');

/** A compiled contract: its ABI and creation bytecode. */
export interface Artifact {
  abi: unknown[];
  bytecode: `0x${string}`;
}

/** The compiler's settings: fixed, so that the same sources give the same bytecode everywhere. */
const SETTINGS = { optimizer: { enabled: true, runs: 200 }, evmVersion: 'cancun', outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object'] } } };

/**
 * Compiles the contracts with solc-js (offline: the compiler is the `solc` npm package, and
 * OpenZeppelin's sources come from node_modules). A development dependency: the artifacts are
 * committed, and a test checks that they match the sources.
 */
export function compileContracts(): { version: string; contracts: Record<string, Artifact> } {
  const require = createRequire(import.meta.url);
  const solc = require('solc') as { compile(input: string, options: { import: (p: string) => { contents: string } | { error: string } }): string; version(): string };
  const sources: Record<string, { content: string }> = {};
  for (const f of readdirSync(CONTRACTS_DIR).filter((n) => n.endsWith('.sol')).sort()) sources[f] = { content: readFileSync(join(CONTRACTS_DIR, f), 'utf8') };
  const findImports = (path: string) => {
    try {
      return { contents: readFileSync(require.resolve(path), 'utf8') };
    } catch {
      return { error: `${path} not found` };
    }
  };
  const output = JSON.parse(solc.compile(JSON.stringify({ language: 'Solidity', sources, settings: SETTINGS }), { import: findImports })) as {
    errors?: { severity: string; formattedMessage: string }[];
    contracts: Record<string, Record<string, { abi: unknown[]; evm: { bytecode: { object: string } } }>>;
  };
  const errors = (output.errors ?? []).filter((e) => e.severity === 'error');
  if (errors.length > 0) throw new TensorLinkError(`the contracts do not compile:\n${errors.map((e) => e.formattedMessage).join('\n')}`);
  const contracts: Record<string, Artifact> = {};
  for (const file of Object.keys(sources)) {
    for (const [name, c] of Object.entries(output.contracts[file] ?? {})) {
      if (c.evm.bytecode.object) contracts[name] = { abi: c.abi, bytecode: `0x${c.evm.bytecode.object}` }; // interfaces have none
    }
  }
  return { version: solc.version(), contracts };
}
