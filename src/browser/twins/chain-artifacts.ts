// src/chain/artifacts.ts for the browser build: the committed artifacts, bundled (a tab reads no files).
import type { Artifact } from '../../chain/index.ts';
import data from '../../chain/artifacts.json';

export function artifacts(): Record<string, Artifact> {
  return (data as unknown as { contracts: Record<string, Artifact> }).contracts;
}
