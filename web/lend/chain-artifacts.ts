// src/chain/artifacts.ts for the browser build: the committed artifacts, bundled (a tab reads no files).
import type { Artifact } from '../../src/chain/compile.ts';
import data from '../../src/chain/artifacts.json';

export function artifacts(): Record<string, Artifact> {
  return (data as unknown as { contracts: Record<string, Artifact> }).contracts;
}
