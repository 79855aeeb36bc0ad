// `npm test`'s runner: typechecks, lints and builds dist/ side by side (the build so that every node a test starts
// runs compiled JavaScript, not TypeScript through tsx: `npm run build:test`, the CLI's bundle made by esbuild from
// src/ without tsc's emit, which would compile again what the typecheck compiles; test/cli/build.test.ts runs the
// whole `npm run build`), then runs the test files three at a time on two cores (each its own process; the longest
// first, by test/durations.json, files not in it before all; most of them wait on sockets and timers part of the
// time). The demo's file starts, with a file that mostly waits beside it, when the pool's queue holds only its last
// small files (its 5-minute gate measures the demo, not a neighbour's heavy computing). The run ends with the ten
// slowest files. Files that mostly wait also run beside the checks, from the moment the build is done
// (BESIDE_CHECKS, BESIDE_DEMO). Exits non-zero if a check or any file failed. (Four at a time with the checks beside
// the tests was slower on 2 cores: 555 s for the files instead of 440.) The test files run as JavaScript that esbuild
// bundled (our code only; packages stay imports) into .test-build/, which starts a file's process in a third of the
// CPU that tsx's on-the-fly compiling takes; --tsx runs them through tsx instead.
//   node scripts/test.mjs [FILE...] [--concurrency N] [--no-build] [--no-checks] [--save-durations] [--tsx]
import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { bundle } from './bundle.mjs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const DURATIONS = `${root}test/durations.json`;
const ALONE = 'test/demo.test.ts';
/**
 * Files that spend most of their time waiting (on timers, other hosts' processes, NAT routers: 15–18 of 55–66 s on the
 * CPU for the NAT file, counting every process it starts), run beside the demo, which leaves about half a core idle
 * (it computes on 1.4–1.5 of the 2), rather than taking a lane of the pool for that long. Their seconds stay under the
 * demo's (70–100 s in CI); the links file, once beside them too, made the phase outlast the demo and now runs in the
 * pool.
 */
const BESIDE_DEMO = ['test/p2p/nat.test.ts'];
/**
 * The demo starts when the files left in the pool's queue add up to this many seconds by test/durations.json (about 80
 * files of 3 s or less), not after the last of them: beside the NAT file alone it leaves about half a core idle, and
 * those files fill it. With them it took 96 s locally and 100 s in CI (ci70), against 69–87 s after the pool.
 */
const DEMO_AT_QUEUE_SECONDS = 60;
/**
 * Files that mostly wait too (on the validator forgetting a killed worker, a deadline passing: 20 of 56 s on the CPU for
 * the failover file, 5-7 of 13-17 s for the others), run one after another from the moment the build is done, beside
 * the typecheck and the lint (which leave a core idle once the lint is done), and on beside the pool if the checks end
 * first: a fourth process that asks little of the CPU, where the pool would give each a lane of three. None of them
 * times what it asserts closer than 10 s. (The CPU seconds the runner prints leave out processes the file did not wait
 * for, Chromium's among them; these were read from a cgroup of the file's own.)
 */
const BESIDE_CHECKS = ['test/user/failover.test.ts', 'test/p2p/swarm.test.ts', 'test/ledger/validators.test.ts'];
const TIME = existsSync('/usr/bin/time') ? '/usr/bin/time' : null;
/**
 * A cgroup (v1 cpuacct) of each file's own where this process may make one (root on such a machine, as CI is): it
 * counts the CPU of every process the file starts, Chromium's and the nodes it did not wait for among them, which GNU
 * time leaves out (11 of 44 s for test/browser/lend-webgpu.test.ts). Elsewhere GNU time's figure is printed.
 */
const CPUACCT = (() => {
  const dir = '/sys/fs/cgroup/cpuacct';
  try {
    accessSync(dir, constants.W_OK);
    return existsSync(`${dir}/cpuacct.usage`) ? dir : null;
  } catch {
    return null;
  }
})();

const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  args.splice(i, 1);
  return true;
};
const valueOf = (name) => {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const [, value] = args.splice(i, 2);
  return value;
};
const concurrency = Number(valueOf('--concurrency') ?? Math.min(8, availableParallelism() + 1));
if (!Number.isInteger(concurrency) || concurrency < 1) {
  // else no lane would start and no file would run
  process.stderr.write('--concurrency must be a whole number of at least 1\n');
  process.exit(2);
}
const build = !flag('--no-build');
const checked = !flag('--no-checks');
const save = flag('--save-durations');
const viaTsx = flag('--tsx');
/** Folders of test/ that hold what tests read and share, not tests. */
const NOT_SUITES = new Set(['test/fixtures', 'test/helpers']);
/** test/<folder>/…/<name>.test.ts at any depth: every file the suite runs besides the demo's (test/demo.test.ts). */
const suite = () => {
  const under = (dir) => readdirSync(`${root}${dir}`, { withFileTypes: true }).flatMap((d) => {
    const path = `${dir}/${d.name}`;
    if (d.isDirectory()) return NOT_SUITES.has(path) ? [] : under(path);
    return dir !== 'test' && d.name.endsWith('.test.ts') ? [path] : [];
  });
  return under('test').sort();
};
const chosen = args.length > 0 ? args : [...suite(), ALONE];

/**
 * The tests' GPU where the machine names none: SwiftShader, the Vulkan GPU in software that Debian's chromium-common
 * ships (.ci/run installs it), for the webgpu backend's tests (test/tensor/backends/webgpu.test.ts and the tests of
 * workers on webgpu). Vulkan's loader reads these when a process starts, so they are set for every test process.
 */
const SWIFTSHADER = { icd: '/usr/lib/chromium/vk_swiftshader_icd.json', lib: '/usr/lib/chromium' };
const testEnv = { ...process.env };
// set by bundleTests once it has made the bundles, not taken from the shell (a --tsx run has none)
delete testEnv.TL_TEST_BUILD;
if (testEnv.VK_ICD_FILENAMES === undefined && existsSync(SWIFTSHADER.icd)) {
  testEnv.VK_ICD_FILENAMES = SWIFTSHADER.icd;
  testEnv.LD_LIBRARY_PATH = [testEnv.LD_LIBRARY_PATH, SWIFTSHADER.lib].filter(Boolean).join(':');
}

/** Runs a command with its output held: resolves when it ends, to its exit, its output and its seconds. */
function held(command) {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(command[0], command.slice(1), { cwd: root, stdio: ['ignore', 'pipe', 'pipe'], env: testEnv });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    child.once('close', (code, signal) => resolve({ code, signal, out, seconds: (Date.now() - started) / 1000 }));
  });
}

/** Runs `npm run NAME`; resolves to whether it passed (its output is printed only if it failed). */
async function npmRun(name) {
  const { code, out, seconds } = await held(['npm', 'run', name, '--silent']);
  process.stderr.write(`npm run ${name}: ${code === 0 ? 'ok' : `FAILED (${code})`} in ${seconds.toFixed(1)} s\n${code === 0 ? '' : out}`);
  return code === 0;
}

/**
 * Scripts of test/ that test files start as processes of their own, bundled beside them: a test finds the bundle through
 * TL_TEST_BUILD (test/helpers/processes.ts: helperArgs), where tsx would take about 3 CPU-s more to start each.
 */
const HELPERS = ['test/helpers/ends-user.ts'];

/**
 * Bundles the test files and HELPERS into .test-build/ (each module's `import.meta.url` the URL of its source), and
 * names that folder to the test processes (TL_TEST_BUILD): file → its bundle.
 */
async function bundleTests(files) {
  const outdir = join(root, '.test-build');
  rmSync(outdir, { recursive: true, force: true });
  const entries = [...new Set([...files, ...HELPERS])];
  const seconds = await bundle({
    entryPoints: entries.map((f) => ({ in: join(root, f), out: f.replace(/\.ts$/, '') })), outdir, under: root, filter: /\.ts$/,
    loader: 'ts', ownUrl: (path) => JSON.stringify(pathToFileURL(path).href), absWorkingDir: root,
  });
  process.stderr.write(`bundled ${files.length} test files and ${entries.length - files.length} helper(s) in ${seconds.toFixed(1)} s\n`);
  testEnv.TL_TEST_BUILD = outdir;
  return new Map(files.map((f) => [f, join(outdir, f.replace(/\.ts$/, '.js'))]));
}

const known = existsSync(DURATIONS) ? JSON.parse(readFileSync(DURATIONS, 'utf8')) : {};
/**
 * The longest first. A file with no duration yet (new since test/durations.json was saved) starts before all: taken as
 * short it would start last, and one of 30 s then ran alone after the rest (five such files held the demo's start back
 * by 30 s); `--save-durations` records them.
 */
const byLength = (files) => [...files].sort((a, b) => (known[b] ?? Infinity) - (known[a] ?? Infinity) || 0);

/** Node 20.14+ and 22+: the test runner may end the process once the file's tests are done (see runFile). */
const [NODE_MAJOR, NODE_MINOR] = process.versions.node.split('.').map(Number);
const FORCE_EXIT = NODE_MAJOR >= 22 || (NODE_MAJOR === 20 && NODE_MINOR >= 14) ? ['--test-force-exit'] : [];

/** Cgroups that a process of their file still held when it ended: removed again once every file has run. */
const leftGroups = [];

/** The CPU seconds a cgroup's processes used; the cgroup is removed (tried again at the end where a process of it still runs). */
function groupSeconds(group) {
  const seconds = Number(readFileSync(`${group}/cpuacct.usage`, 'utf8')) / 1e9;
  try {
    rmdirSync(group);
  } catch {
    leftGroups.push(group);
  }
  return seconds;
}

/** Runs one test file in its own process; its output is printed whole when it ends. */
async function runFile(file) {
  const name = `tl-test-${process.pid}-${file.replaceAll('/', '_')}`;
  const group = CPUACCT ? join(CPUACCT, name) : null;
  if (group) mkdirSync(group, { recursive: true });
  // else GNU time, where it is installed, adds the CPU seconds of the file and the processes it waited for
  const usage = !group && TIME ? join(tmpdir(), `${name}.cpu`) : null;
  const { code, signal, out, seconds } = await held([
    // the shell moves itself into the file's cgroup (a failure to is no failure of the file), then becomes the file's node
    ...(group ? ['sh', '-c', `echo $$ > ${group}/cgroup.procs 2>/dev/null; exec "$@"`, 'sh'] : []),
    ...(usage ? [TIME, '-f', '%U %S', '-o', usage] : []), process.execPath,
    // --test-force-exit: a file ends when its tests and hooks have, even if a native library keeps a thread referenced
    // (WebRTC's libdatachannel once held a test process that had stopped every node, with nothing left to run)
    // the old generation's headroom as the CLI's processes have it (src/cli/heap.ts): V8's own choice made a small
    // heap collect continuously
    '--heap-growing-percent=100',
    ...(bundled.has(file) ? [] : ['--import', 'tsx']), ...FORCE_EXIT, '--test-reporter=spec', bundled.get(file) ?? file,
  ]);
  const ok = code === 0;
  const timed = () => (usage && existsSync(usage) ? readFileSync(usage, 'utf8').trim().split(/\s+/).slice(-2).reduce((a, b) => a + Number(b), 0) : null);
  const cpu = group ? groupSeconds(group) : timed();
  if (usage) rmSync(usage, { force: true });
  const cpuText = cpu === null || Number.isNaN(cpu) ? '' : `, ${cpu.toFixed(1)} s of CPU`;
  process.stdout.write(`\n${ok ? '✔' : '✖'} ${file} (${seconds.toFixed(1)} s${cpuText})${ok ? '' : ` exited ${code ?? signal}`}\n${out}`);
  return { file, seconds, cpu, ok, out: ok ? '' : out };
}

/**
 * What a failed file's reporter said of its failures (node's spec reporter ends with them, from "failing tests:"), at
 * most `limit` characters: printed again at the very end, where a log cut to its last lines (a CI summary) still has it.
 */
function failures(out, limit = 6000) {
  const at = out.lastIndexOf('failing tests:');
  const text = at >= 0 ? out.slice(at) : out;
  return text.length > limit ? `${text.slice(0, limit)}\n  … (${text.length - limit} characters more)` : text;
}

/** Set when a check failed: a lane starts no other file. */
let stopping = false;

/**
 * Runs `files` `width` at a time, the longest first, and returns their results. `tail.start` (when given) is called
 * once: as soon as every file left in the queue has a duration and those add up to `tail.seconds` or less, or else once
 * the lanes are done. The lanes drain the queue beside what it started (with one lane, three processes may run), and
 * what it resolves to is returned after the pool's own results.
 */
async function pool(files, width, tail = null) {
  const queue = byLength(files);
  let tailRun = null;
  const results = [];
  // read from the queue each time (at most a few hundred files): every one left has a duration, and they add up to little
  const startTail = () => {
    if (tail === null || tailRun !== null || queue.some((f) => known[f] === undefined)) return;
    if (queue.reduce((n, f) => n + known[f], 0) <= tail.seconds) tailRun = tail.start();
  };
  const lane = async () => {
    for (let file = queue.shift(); file !== undefined && !stopping; file = queue.shift()) {
      startTail();
      results.push(await runFile(file));
    }
  };
  startTail();
  await Promise.all(Array.from({ length: Math.max(1, width) }, lane));
  if (tail !== null && tailRun === null) tailRun = tail.start();
  return [...results, ...(tailRun === null ? [] : await tailRun)];
}

// the checks, the build and the tests' bundle side by side; once the build is done, the files of BESIDE_CHECKS start
// one after another beside the checks (they run on into the pool's time if the checks end first)
const started = Date.now();
const building = build ? npmRun('build:test') : Promise.resolve(true);
const checks = Promise.all([building, ...(checked ? ['typecheck', 'lint'] : []).map(npmRun)]);
const bundled = viaTsx ? new Map() : await bundleTests(chosen);
const demo = chosen.includes(ALONE);
const early = chosen.filter((f) => BESIDE_CHECKS.includes(f));
const beside = demo ? chosen.filter((f) => BESIDE_DEMO.includes(f)) : [];
const earlyResults = (await building) ? pool(early, 1) : Promise.resolve([]);
if (!(await checks).every(Boolean)) {
  // a file already started ends as it would (its hooks stop what it started); no other starts
  stopping = true;
  const ran = await earlyResults;
  process.stderr.write(`the checks or the build failed: ${ran.length > 0 ? 'no other test file was run' : 'the tests were not run'}\n`);
  process.exit(1);
}
// the demo and the files beside it start while the pool's lanes drain its last files
const demoPhase = demo
  ? { seconds: DEMO_AT_QUEUE_SECONDS, start: async () => (await Promise.all([pool([ALONE], 1), pool(beside, 1)])).flat() }
  : null;
const results = await pool(chosen.filter((f) => f !== ALONE && !early.includes(f) && !beside.includes(f)), concurrency, demoPhase);
results.push(...(await earlyResults));
for (const group of leftGroups) {
  try {
    rmdirSync(group);
  } catch {
    // still held: a process a file started outlives every file (the kernel keeps an empty cgroup until it is removed)
  }
}
const failed = results.filter((r) => !r.ok);
const slowest = [...results].sort((a, b) => b.seconds - a.seconds).slice(0, 10);
process.stdout.write(`\nthe ten slowest test files (of ${results.length}; ${((Date.now() - started) / 1000).toFixed(0)} s in all, ${concurrency} at a time):\n`);
for (const r of slowest) process.stdout.write(`  ${r.seconds.toFixed(1).padStart(7)} s  ${r.cpu === null ? '' : `(CPU ${r.cpu.toFixed(0).padStart(4)} s)  `}${r.file}\n`);
if (save) {
  const durations = { ...known, ...Object.fromEntries(results.map((r) => [r.file, Math.round(r.seconds)])) };
  writeFileSync(DURATIONS, `${JSON.stringify(Object.fromEntries(Object.entries(durations).sort()), null, 2)}\n`);
}
for (const r of failed) process.stdout.write(`\n✖ ${r.file}: ${failures(r.out)}\n`);
if (failed.length > 0) process.stdout.write(`\n${failed.length} test file(s) failed:\n${failed.map((r) => `  ${r.file}\n`).join('')}`);
if (failed.length > 0) process.exit(1);
process.stdout.write(`\nall ${results.length} test files passed\n`);
