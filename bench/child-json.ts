import { spawn } from 'node:child_process';

/**
 * Runs a command whose last line of stdout is one JSON object (a bench's child process: one engine, one variant), and
 * resolves with it; rejects with `what`, the exit code and the end of its stderr otherwise.
 * @example
 * const r = await runJson<ChildResult>(process.execPath, ['--import', 'tsx', script, JSON.stringify(job)], process.env, 'ours int4')
 */
export function runJson<T>(command: string, args: readonly string[], env: NodeJS.ProcessEnv = process.env, what = command): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, [...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => {
      const line = out.trim().split('\n').pop() ?? '';
      if (code !== 0 || !line.startsWith('{')) reject(new Error(`${what} exited with ${code}: ${err.trim().split('\n').slice(-5).join(' | ')}`));
      else resolve(JSON.parse(line) as T);
    });
  });
}

/** A TypeScript child of the bench (its script's path), run under tsx with `job` as its argument. */
export function runTsChild<T>(script: string, job: unknown, what: string, env: NodeJS.ProcessEnv = process.env): Promise<T> {
  return runJson<T>(process.execPath, ['--import', import.meta.resolve('tsx'), script, JSON.stringify(job)], env, what);
}
