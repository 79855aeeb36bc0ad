import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const BIN = fileURLToPath(new URL('../../bin/tensorlink.js', import.meta.url));

export interface Running {
  child: ChildProcess;
  peerId: string;
  addrs: string[];
}

/** Starts `tensorlink <args>` as its own process and waits for its {"event":"ready"} line. */
export function startNode(args: string[], timeoutMs = 30_000): Promise<Running> {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`no ready line from ${args.join(' ')} within ${timeoutMs} ms: ${err}`));
    }, timeoutMs);
    child.stderr?.on('data', (d) => {
      err += d;
    });
    child.stdout?.on('data', (d) => {
      out += d;
      const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
      if (line) {
        clearTimeout(timer);
        const ready = JSON.parse(line) as { peerId: string; addrs: string[] };
        resolve({ child, peerId: ready.peerId, addrs: ready.addrs });
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${args.join(' ')} exited with ${code}: ${err}`));
    });
  });
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
