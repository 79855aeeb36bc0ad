import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';

// onnxruntime 1.30 starts its 1DS telemetry at the first OrtEnv unless ORT_DISABLE_TELEMETRY is
// set: the visible trace is an empty mat-debug-<pid>.log in the temp folder (src/tensor/backends/ort/telemetry.ts).
for (const runtime of ['ffi', 'binding'] as const) {
  test(`the ort backend (${runtime}) starts no telemetry: no mat-debug-<pid>.log`, () => {
    const script = `
      import { createOrtBackend } from './src/tensor/backends/ort/backend.ts';
      createOrtBackend({ runtime: '${runtime}', threads: 1 });
      process.stdout.write(String(process.pid));
    `;
    const env = { ...process.env };
    delete env.ORT_DISABLE_TELEMETRY;
    delete env.CI; // CI=true also quietens onnxruntime's telemetry: test the project's own switch
    const run = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { env, encoding: 'utf8' });
    assert.equal(run.status, 0, run.stderr);
    const pid = Number(run.stdout.trim());
    assert.ok(pid > 0);
    assert.equal(existsSync(join(env.TMPDIR ?? tmpdir(), `mat-debug-${pid}.log`)), false);
  });
}
