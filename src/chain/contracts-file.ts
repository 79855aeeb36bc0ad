import { readFileSync, writeFileSync } from 'node:fs';
import { isAddress } from 'viem';
import { InvalidArgumentError } from '../errors.ts';
import type { Contracts } from './deploy.ts';

/** Where a deployment lives: what `tensorlink chain --out FILE` writes and `--contracts FILE` reads. */
export interface Deployment {
  rpc: string;
  chainId: number;
  contracts: Contracts;
}

const NAMES = ['token', 'staking', 'escrow', 'settlement'] as const;

/** Parses a deployment (from a file a person may have edited): every field checked, or a typed error. */
export function parseDeployment(v: unknown, where: string): Deployment {
  const m = (typeof v === 'object' && v !== null ? v : {}) as Record<string, unknown>;
  const c = (typeof m.contracts === 'object' && m.contracts !== null ? m.contracts : {}) as Record<string, unknown>;
  if (typeof m.rpc !== 'string' || !/^https?:\/\//.test(m.rpc)) throw new InvalidArgumentError(`${where}: "rpc" must be an http(s) URL`);
  if (!Number.isSafeInteger(m.chainId) || (m.chainId as number) <= 0) throw new InvalidArgumentError(`${where}: "chainId" must be a positive integer`);
  for (const n of NAMES) {
    if (typeof c[n] !== 'string' || !isAddress(c[n] as string)) throw new InvalidArgumentError(`${where}: "contracts.${n}" must be an address (0x and 40 hex digits)`);
  }
  return { rpc: m.rpc, chainId: m.chainId as number, contracts: Object.fromEntries(NAMES.map((n) => [n, c[n]])) as unknown as Contracts };
}

export function readDeployment(path: string): Deployment {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (cause) {
    throw new InvalidArgumentError(`cannot read the contracts file ${path}: ${(cause as Error).message}`, { cause });
  }
  try {
    return parseDeployment(JSON.parse(text), path);
  } catch (err) {
    if (err instanceof SyntaxError) throw new InvalidArgumentError(`${path} is not JSON: ${err.message}`);
    throw err;
  }
}

export function writeDeployment(path: string, d: Deployment): void {
  writeFileSync(path, `${JSON.stringify(d, null, 2)}\n`);
}
