import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launchNode } from '../../src/swarm/index.ts';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

/**
 * Node's arguments for a script of test/ that a test starts as a process of its own (`path` from the project's root,
 * e.g. test/helpers/ends-user.ts): its bundle where `npm test` made one (TL_TEST_BUILD, scripts/test.mjs's HELPERS),
 * else its source through tsx.
 */
export function helperArgs(path: string): string[] {
  const build = process.env.TL_TEST_BUILD;
  const bundled = build ? join(build, path.replace(/\.ts$/, '.js')) : null;
  return bundled && existsSync(bundled) ? [bundled] : ['--import', 'tsx', path];
}

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

/** The processes started with `--parent-pid PID` (a local swarm's nodes) that are still alive, as `ps` lists them. */
export function swarmChildren(pid: number): string[] {
  const out = spawnSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' }).stdout;
  return out.split('\n').filter((l) => l.includes(`--parent-pid ${pid}`));
}

/** Waits up to 10 s for the local swarm of process `pid` to end; resolves to those of its nodes still alive. */
export async function swarmGone(pid: number): Promise<string[]> {
  const deadline = Date.now() + 10_000;
  while (swarmChildren(pid).length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
  return swarmChildren(pid);
}

/**
 * `tensorlink serve ARGS` (on any free port, js backend) as its own process, once it prints its ready line.
 * @param env the process's environment (default: this one's)
 */
export function startServe(
  args: string[], options: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<{ child: ChildProcess; url: string }> {
  const argv = [BIN, 'serve', '--port', '0', '--backend', 'js', ...args];
  const child = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: options.env ?? process.env });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`serve did not start: ${err}`)), options.timeoutMs ?? 120_000);
    child.stderr!.on('data', (d) => (err += d));
    child.stdout!.on('data', (d) => {
      out += d;
      const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
      if (line) {
        clearTimeout(timer);
        resolve({ child, url: (JSON.parse(line) as { url: string }).url });
      }
    });
    child.once('exit', (code) => reject(new Error(`serve exited (${code}): ${err}`)));
  });
}

/** Resident memory of a process (VmRSS), in bytes. */
export function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}
