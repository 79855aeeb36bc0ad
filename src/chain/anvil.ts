import { type ChildProcess, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { TensorLinkError } from '../errors.ts';

/** A local Ethereum node: anvil from the npm registry, on a free loopback port. */
export interface LocalChain {
  rpc: string;
  chainId: number;
  process: ChildProcess;
  stop(): Promise<void>;
}

/** anvil's accounts are derived from this well-known test mnemonic: for a local chain only. */
export const ANVIL_MNEMONIC = 'test test test test test test test test test test test junk';

/** The anvil binary that `@foundry-rs/anvil` installed for this platform. */
export function anvilBinary(): string {
  const arch = process.arch === 'x64' ? 'amd64' : process.arch;
  const pkg = `@foundry-rs/anvil-${process.platform}-${arch}`;
  try {
    return createRequire(import.meta.url).resolve(`${pkg}/bin/anvil`);
  } catch (cause) {
    throw new TensorLinkError(`anvil is not installed for ${process.platform}-${arch} (${pkg}): run npm ci, or pass --rpc URL to use another chain`, { cause });
  }
}

/** Starts anvil on 127.0.0.1 (a free port unless `port`), and resolves once it listens. */
export function startAnvil(options: { port?: number; chainId?: number; accounts?: number; timeoutMs?: number } = {}): Promise<LocalChain> {
  const chainId = options.chainId ?? 31337;
  const args = ['--host', '127.0.0.1', '--port', String(options.port ?? 0), '--chain-id', String(chainId), '--accounts', String(options.accounts ?? 10)];
  // anvil cannot watch its parent: a shell beside it ends it when this process is gone, even killed with SIGKILL
  const watch = `"$0" "$@" & a=$!; trap 'kill $a 2>/dev/null' TERM INT; `
    + `while kill -0 ${process.pid} 2>/dev/null && kill -0 $a 2>/dev/null; do sleep 0.5; done; kill $a 2>/dev/null; wait $a`;
  const child = spawn('/bin/sh', ['-c', watch, anvilBinary(), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  const stop = () => new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new TensorLinkError(`anvil did not start within ${options.timeoutMs ?? 15_000} ms: ${out.slice(-400)}`));
    }, options.timeoutMs ?? 15_000);
    const read = (d: Buffer) => {
      out += d;
      const m = /Listening on (127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        child.stdout?.off('data', read);
        child.stdout?.resume();
        resolve({ rpc: `http://${m[1]}`, chainId, process: child, stop });
      }
    };
    child.stdout?.on('data', read);
    child.stderr?.on('data', (d) => (out += d));
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(new TensorLinkError(`anvil could not start: ${err.message}`, { cause: err }));
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new TensorLinkError(`anvil exited (${code}) before listening: ${out.slice(-400)}`));
    });
  });
}
