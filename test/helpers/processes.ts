import type { ChildProcess } from 'node:child_process';
import { launchNode } from '../../src/cli/local-swarm.ts';

export interface Running {
  child: ChildProcess;
  peerId: string;
  addrs: string[];
}

/** Starts `tensorlink <args>` as its own process and waits for its {"event":"ready"} line. */
export async function startNode(args: string[], timeoutMs = 30_000): Promise<Running> {
  const node = await launchNode(args, timeoutMs);
  return { child: node.process, peerId: node.peerId, addrs: node.addrs };
}

export async function waitFor<T>(
  what: string,
  fn: () => Promise<T | null | undefined | false>,
  timeoutMs: number,
): Promise<{ value: T; ms: number }> {
  const start = Date.now();
  for (;;) {
    const value = await fn().catch(() => null);
    if (value) return { value, ms: Date.now() - start };
    if (Date.now() - start > timeoutMs) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

export function alive(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}
