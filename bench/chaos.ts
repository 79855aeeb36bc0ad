/**
 * `npm run chaos -- --minutes 10 [--seed N]` (not in CI): a swarm under faults for N minutes, then checked.
 *
 * A validator, six workers (four on their own hosts, two at home behind an nftables NAT: network namespaces, where the
 * machine allows; on 127.0.0.1 otherwise), each its own process, and three users in this process. Two workers host
 * model `a`, two model `b` (every block on two hosts); the two at home host nothing. Every 15–30 s a random worker is
 * killed (SIGKILL), paused (SIGSTOP for 5–20 s) or restarted (with its identity), or a link between two hosts is
 * slowed to 2 Mbit/s for 15–30 s (tc tbf). Meanwhile user 0 trains a small GPT-2 across the workers, users 1 and 2
 * stream greedy sessions to `a` and `b`, and a cheater (a host of `b` that adds noise to what it computes) joins at a
 * third of the run and leaves at two thirds. At the end:
 * - every finished session's tokens equal one process's, and every failed one failed with a typed error, none hung;
 * - the training job's losses equal one process's run of the same steps, or it stopped with a typed error;
 * - the ledger's blocks verify; the cheater was caught; no honest worker was flagged; every worker's memory account
 *   stayed within its budget.
 * Prints a summary and writes it as JSON to bench/out/chaos-<time>.json. Exits 1 when a check fails.
 */
import '../src/polyfills.ts';
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { multiaddr } from '@multiformats/multiaddr';
import { additionTask, taskBatch } from '../src/data/index.ts';
import { TensorLinkError } from '../src/errors.ts';
import { blockProblem, type BlockHeader } from '../src/ledger/index.ts';
import {
  byteLevelTokenizerJson, type CausalLM, createModel, generate, gpt2Config, HFTokenizer, llamaConfig, loadModel, LocalTrainer, saveModel,
} from '../src/models/index.ts';
import { createNode, parseStatsAnswer, publicKeyOf, request, type TensorLinkNode } from '../src/p2p/index.ts';
import { launchNode } from '../src/swarm/index.ts';
import { Generator, setBackend } from '../src/tensor/index.ts';
import { distribute, fetchOverview, HostedModel, listPeers } from '../src/user/index.ts';
import { parseBlocksAnswer, parseHead } from '../src/validator/ledger-messages.ts';
import { type Home, natHome } from '../test/helpers/nat.ts';
import { hostMesh, type Mesh } from '../test/helpers/netns.ts';
import { waitFor } from '../test/helpers/processes.ts';

const { values } = parseArgs({ options: { minutes: { type: 'string', default: '10' }, seed: { type: 'string', default: '1' } } });
const MINUTES = Number(values.minutes);
const rng = new Generator(Number(values.seed));
const log = (s: string) => process.stderr.write(`[${((Date.now() - started) / 1000).toFixed(0).padStart(4)} s] ${s}\n`);
let started = Date.now();
/** When the faults stop: MINUTES after the swarm is up (set then). */
let endAt = Number.POSITIVE_INFINITY;
/** A session or a training step that takes longer than this hangs (a lost host is replaced well within it). */
const HANG_MS = 180_000;
const MEMORY = '512MiB';

setBackend('js');
const root = mkdtempSync(join(tmpdir(), 'tl-chaos-'));
const children = new Set<ChildProcess>();

// the hosts: the validator's, four workers', two homes' routers (their workers behind them); 127.0.0.1 without netns
let mesh: Mesh | null = null;
const homes: Home[] = [];
try {
  mesh = hostMesh(7, { subnet: `11.${(process.pid % 200) + 20}.13`, publicRange: true });
  homes.push(natHome(mesh.hosts[5]), natHome(mesh.hosts[6]));
} catch (err) {
  log(`no network namespaces (${(err as Error).message}): every process on 127.0.0.1, no NAT, no slowed links`);
}
const listen = mesh ? ['--listen', '/ip4/0.0.0.0/tcp/0'] : [];
const prefixOf = (i: number) => (mesh ? (i < 4 ? mesh.hosts[i + 1].exec : homes[i - 4].host.exec) : undefined);

/** A process of the swarm; `start` launches it again with the same identity (its --data directory). */
interface Proc {
  name: string;
  args: string[];
  prefix?: string[];
  child: ChildProcess | null;
  peerId: string;
  addrs: string[];
  paused: boolean;
  /** The most resident memory any of its processes reached (VmHWM), bytes. */
  peakRss: number;
  /** Its memory account's largest use against its total (stats). */
  peakUse: number;
  honest: boolean;
}

function hwm(pid: number | undefined): number {
  try {
    return Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) * 1024;
  } catch {
    return 0;
  }
}

async function start(p: Proc): Promise<void> {
  const n = await launchNode(p.args, 60_000, p.prefix ? { prefix: p.prefix } : {});
  p.child = n.process;
  p.peerId = n.peerId;
  p.addrs = n.addrs;
  p.paused = false;
  children.add(n.process);
  n.process.once('exit', () => children.delete(n.process));
}

function stop(p: Proc, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (!p.child) return;
  p.peakRss = Math.max(p.peakRss, hwm(p.child.pid));
  if (p.paused) p.child.kill('SIGCONT');
  p.child.kill(signal);
  p.child = null;
}

const proc = (name: string, args: string[], prefix: string[] | undefined, honest = true): Proc =>
  ({ name, args, prefix, child: null, peerId: '', addrs: [], paused: false, peakRss: 0, peakUse: 0, honest });

// the models: two hosted Llamas (4 blocks), and the GPT-2 the job trains
const models = { a: join(root, 'a'), b: join(root, 'b') };
const hostedConfig = llamaConfig({ vocabSize: 256, hidden: 64, layers: 4, heads: 4, kvHeads: 2, intermediate: 172, maxPositions: 128 });
await saveModel(createModel(hostedConfig, { seed: 11 }), models.a);
await saveModel(createModel(hostedConfig, { seed: 12 }), models.b);
const local: Record<'a' | 'b', CausalLM> = { a: await loadModel(models.a), b: await loadModel(models.b) };

const validator = proc('validator', ['validator', '--backend', 'js', '--data', join(root, 'validator'), ...listen], mesh?.hosts[0].exec);
await start(validator);
const boot = mesh ? validator.addrs.find((a) => a.startsWith(`/ip4/${mesh!.hosts[0].ip}/`))! : validator.addrs[0];
const worker = (i: number, extra: string[], honest = true) => proc(`worker ${i}`, [
  'worker', '--bootstrap', boot, '--backend', 'js', '--memory', MEMORY, '--data', join(root, `worker-${i}`), ...listen, ...extra,
], prefixOf(i), honest);
const workers = [
  worker(0, ['--host', `a=${models.a}`]), worker(1, ['--host', `a=${models.a}`]),
  worker(2, ['--host', `b=${models.b}`]), worker(3, ['--host', `b=${models.b}`]),
  worker(4, []), worker(5, []),
];
for (const w of workers) await start(w);
// the cheater: a host of b on worker 3's host, computing with noise added
const cheater = proc('cheater', [
  'worker', '--bootstrap', boot, '--backend', 'js', '--memory', MEMORY, '--data', join(root, 'cheater'), ...listen,
  '--host', `b=${models.b}`, '--fault', 'noise:1',
], mesh?.hosts[4].exec, false);

const users: TensorLinkNode[] = await Promise.all([0, 1, 2].map(() => createNode(mesh ? { listen: [`/ip4/${mesh.rootIp}/tcp/0`] } : {})));
const at = multiaddr(boot);
await waitFor('every worker listed and both models served', async () => {
  const peers = await listPeers(users[0], at);
  return workers.every((w) => peers.some((p) => p.peerId === w.peerId));
}, 60_000);
started = Date.now();
endAt = started + MINUTES * 60_000;
log(`swarm up: validator ${validator.peerId.slice(-6)}, workers ${workers.map((w) => w.peerId.slice(-6)).join(', ')}${mesh ? ' (4 on their hosts, 2 behind NAT)' : ''}`);

const typedName = (err: unknown) => (err instanceof TensorLinkError ? err.name : null);
const withDeadline = <T>(p: Promise<T>, what: string): Promise<T> => Promise.race([
  p, new Promise<never>((_, reject) => setTimeout(() => reject(new HangError(`${what} took more than ${HANG_MS / 1000} s`)), HANG_MS).unref()),
]);
class HangError extends Error {}

// sessions: users 1 and 2, one model each, one greedy session after another
const sessions = { ok: 0, mismatched: [] as string[], typed: new Map<string, number>(), untyped: [] as string[], hung: [] as string[] };
const caughtBy = new Map<string, number>();
async function streamSessions(user: TensorLinkNode, name: 'a' | 'b'): Promise<void> {
  let model: HostedModel | null = null;
  for (let i = 0; Date.now() < endAt; i++) {
    const prompt = Array.from({ length: 4 + (i % 5) }, () => rng.int(256));
    const options = { maxNewTokens: 12, temperature: 0, stopTokens: [] };
    try {
      model ??= await HostedModel.open(user, at, name, { ends: local[name], verify: { mode: 'reexec', sampleRate: 0.25 }, ledger: true });
      const want = (await generate(local[name], prompt, options)).tokens;
      const { tokens } = await withDeadline(model.generate(prompt, options), `a session on ${name}`);
      if (JSON.stringify(tokens) === JSON.stringify(want)) sessions.ok++;
      else sessions.mismatched.push(`${name}: ${JSON.stringify(tokens)} for ${JSON.stringify(want)}`);
      for (const peer of model.verification.flagged) if (!caughtBy.has(peer)) caughtBy.set(peer, Date.now() - started);
    } catch (err) {
      const typed = typedName(err);
      if (err instanceof HangError) sessions.hung.push((err as Error).message);
      else if (typed) sessions.typed.set(typed, (sessions.typed.get(typed) ?? 0) + 1);
      else sessions.untyped.push(`${(err as Error).name}: ${(err as Error).message}`);
      if (model) for (const peer of model.verification.flagged) if (!caughtBy.has(peer)) caughtBy.set(peer, Date.now() - started);
      // a model whose hosts all failed is opened again (the index may list others by now)
      await model?.close().catch(() => {});
      model = null;
      await new Promise((r) => setTimeout(r, 1_000));
    }
  }
  await model?.close().catch(() => {});
}

// training: user 0, the losses of one process step by step
const training = { steps: 0, equal: 0, differing: [] as string[], byCheater: [] as string[], stopped: null as string | null, failovers: 0 };
async function train(): Promise<void> {
  const config = gpt2Config({ vocabSize: 257, hidden: 32, layers: 3, heads: 4, maxPositions: 32 });
  const tok = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  const totalSteps = 10_000;
  const reference = new LocalTrainer(createModel(config, { seed: 5 }), { lr: 3e-3, totalSteps, microBatches: 2 });
  const task = additionTask({ seed: 2 });
  const batches = new Generator(7);
  let dm: Awaited<ReturnType<typeof distribute>> | null = null;
  try {
    dm = await distribute(users[0], boot, createModel(config, { seed: 5 }), { strategy: 'parameter-balanced', training: true });
    const trainer = await dm.trainer({ optimizer: { lr: 3e-3 }, totalSteps, microBatches: 2 });
    while (Date.now() < endAt) {
      const batch = taskBatch(task, tok, batches, 8, 256);
      const want = reference.step(batch).loss;
      // a failover may place a section on the cheater (it is a worker like any): a step it computed before it was caught
      // is its lie, not the swarm's (counted apart; the job rolls back once the validator catches it)
      const cheating = () => cheater.peerId !== '' && dm!.assignment.some((a) => a.peerId === cheater.peerId);
      const before = cheating();
      const { loss } = await withDeadline(trainer.step(batch), `training step ${training.steps + 1}`);
      training.steps++;
      if (loss === want) training.equal++;
      else (before || cheating() ? training.byCheater : training.differing).push(`step ${training.steps}: ${loss} for ${want}`);
    }
    for (const peer of dm.verification?.flagged ?? []) if (!caughtBy.has(peer)) caughtBy.set(peer, Date.now() - started);
  } catch (err) {
    training.stopped = err instanceof HangError ? `hung: ${(err as Error).message}` : `${typedName(err) ?? `untyped ${(err as Error).name}`}: ${(err as Error).message}`;
  } finally {
    training.failovers = dm?.failovers.length ?? 0;
    for (const peer of dm?.verification?.flagged ?? []) if (!caughtBy.has(peer)) caughtBy.set(peer, Date.now() - started);
    await dm?.close().catch(() => {});
  }
}

// the faults
const events: { at: number; kind: string; target: string }[] = [];
const event = (kind: string, target: string) => {
  events.push({ at: Math.round((Date.now() - started) / 1000), kind, target });
  log(`${kind} ${target}`);
};
async function chaos(): Promise<void> {
  let cheaterIn = false;
  while (Date.now() < endAt) {
    await new Promise((r) => setTimeout(r, 15_000 + rng.int(15_001)));
    if (Date.now() >= endAt) break;
    const t = (Date.now() - started) / (endAt - started);
    if (!cheaterIn && t > 1 / 3 && !cheater.child) {
      await start(cheater).catch((err: Error) => log(`the cheater did not start: ${err.message}`));
      cheaterIn = cheater.child !== null;
      if (cheaterIn) event('cheater joins', cheater.peerId.slice(-6));
    } else if (cheaterIn && t > 2 / 3 && cheater.child) {
      stop(cheater, 'SIGTERM');
      event('cheater leaves', cheater.peerId.slice(-6));
    }
    const live = workers.filter((w) => w.child && !w.paused);
    const dead = workers.filter((w) => !w.child);
    const kind = dead.length >= 2 || live.length <= 3 ? 'restart' : (['kill', 'pause', 'restart', 'slow'] as const)[rng.int(mesh ? 4 : 3)];
    if (kind === 'restart') {
      const w = dead.length > 0 ? dead[rng.int(dead.length)] : live[rng.int(live.length)];
      if (w.child) stop(w);
      event(dead.includes(w) ? 'restart (was dead)' : 'restart', w.name);
      await start(w).catch((err: Error) => log(`${w.name} did not start again: ${err.message}`));
    } else if (kind === 'kill') {
      const w = live[rng.int(live.length)];
      stop(w);
      event('SIGKILL', w.name);
    } else if (kind === 'pause') {
      const w = live[rng.int(live.length)];
      const seconds = 5 + rng.int(16);
      w.child!.kill('SIGSTOP');
      w.paused = true;
      event(`SIGSTOP for ${seconds} s`, w.name);
      const child = w.child!;
      setTimeout(() => {
        if (w.child === child) {
          child.kill('SIGCONT');
          w.paused = false;
        }
      }, seconds * 1000);
    } else {
      // a link between two of the hosts (or a host and the users), slowed for a while
      const a = rng.int(8);
      const b = (a + 1 + rng.int(7)) % 8;
      const seconds = 15 + rng.int(16);
      // -1: the users (the root namespace)
      const [x, y] = [a - 1, b - 1];
      mesh!.shape(x, y, 2);
      event(`link slowed to 2 Mbit/s for ${seconds} s`, `${x === -1 ? 'users' : `host ${x}`} ↔ ${y === -1 ? 'users' : `host ${y}`}`);
      setTimeout(() => mesh?.shape(x, y, null), seconds * 1000).unref();
    }
  }
}

// every worker's memory account (asked at the addresses the validator lists: a worker at home by its relay), every 5 s
const sampler = setInterval(() => {
  void listPeers(users[0], at, 5_000).then((peers) => {
    for (const w of [...workers, cheater]) {
      if (!w.child || w.paused) continue;
      w.peakRss = Math.max(w.peakRss, hwm(w.child.pid));
      const record = peers.find((p) => p.peerId === w.peerId);
      if (!record) continue;
      void request(users[0], { peerId: record.peerId, addrs: record.addrs }, { type: 'stats' }, 5_000)
        .then((m) => {
          const { memory } = parseStatsAnswer(m);
          w.peakUse = Math.max(w.peakUse, memory.used / Math.max(1, memory.total));
        })
        .catch(() => {});
    }
  }).catch(() => {});
}, 5_000);

let failed = false;
const check = (ok: boolean, what: string) => {
  log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failed = true;
};
try {
  await Promise.all([train(), streamSessions(users[1], 'a'), streamSessions(users[2], 'b'), chaos()]);
  clearInterval(sampler);
  for (const w of workers) {
    if (!w.child || !w.paused) continue;
    w.child.kill('SIGCONT');
    w.paused = false;
  }

  // the ledger: every block verifies against the one before, signed by the validator
  const head = parseHead(await request(users[0], at, { type: 'ledger-head' }));
  let prev: BlockHeader | null = null;
  let records = 0;
  const problems: string[] = [];
  const signers = { keyOf: publicKeyOf, validators: new Set([validator.peerId]), threshold: 1 };
  for (let h = 0; h < head.height; h++) {
    const [block] = parseBlocksAnswer(await request(users[0], at, { type: 'ledger-blocks', from: h }));
    const problem = block ? blockProblem(block, prev, signers) : `block ${h} missing`;
    if (problem) problems.push(problem);
    records += block?.records.length ?? 0;
    prev = block?.header ?? prev;
  }

  // who the validator and the users caught
  const overview = await fetchOverview(users[0], at);
  const failedChecks = new Set(overview.events.filter((e) => e.kind === 'check-failed').map((e) => e.peer));
  const excluded = new Set((await listPeers(users[0], at)).filter((p) => p.excluded).map((p) => p.peerId));
  const flagged = new Set([...caughtBy.keys(), ...failedChecks, ...excluded]);
  const honestFlagged = workers.filter((w) => flagged.has(w.peerId)).map((w) => w.name);
  const cheaterCaught = cheater.peerId !== '' && flagged.has(cheater.peerId);

  const kindOf = (kind: string) => kind.replace(/ for \d+ s| \(was dead\)/, '');
  const summary = {
    minutes: MINUTES, seed: Number(values.seed), netns: mesh !== null,
    faults: Object.fromEntries([...new Set(events.map((e) => kindOf(e.kind)))]
      .map((k) => [k, events.filter((e) => kindOf(e.kind) === k).length])),
    sessions: {
      ok: sessions.ok, mismatched: sessions.mismatched, failedTyped: Object.fromEntries(sessions.typed),
      untyped: sessions.untyped, hung: sessions.hung,
    },
    training,
    ledger: { blocks: head.height, records, problems },
    cheater: {
      joined: cheater.peerId !== '', caught: cheaterCaught,
      caughtAfterS: caughtBy.has(cheater.peerId) ? Math.round(caughtBy.get(cheater.peerId)! / 1000) : null,
    },
    honestFlagged,
    memory: [...workers, cheater].filter((w) => w.peerId)
      .map((w) => ({ name: w.name, peakAccountShare: Number(w.peakUse.toFixed(3)), peakRssMiB: Math.round(w.peakRss / 2 ** 20) })),
    events,
  };
  mkdirSync('bench/out', { recursive: true });
  const file = `bench/out/chaos-${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
  writeFileSync(file, `${JSON.stringify(summary, null, 2)}\n`);

  log(`faults: ${JSON.stringify(summary.faults)}`);
  check(sessions.mismatched.length === 0, `sessions: ${sessions.ok} equal one process's, ${sessions.mismatched.length} not; failed with a typed error: ${JSON.stringify(summary.sessions.failedTyped)}`);
  check(sessions.untyped.length === 0, `sessions failed with an untyped error: ${sessions.untyped.length}${sessions.untyped.length ? ` (${sessions.untyped.slice(0, 3).join('; ')})` : ''}`);
  check(sessions.hung.length === 0, `sessions that hung past ${HANG_MS / 1000} s: ${sessions.hung.length}`);
  check(training.differing.length === 0 && (training.stopped === null || !/^(untyped|hung)/.test(training.stopped)),
    `training: ${training.steps} steps, ${training.equal} losses equal one process's, ${training.byCheater.length} computed with the cheater in the job, `
    + `${training.failovers} failovers${training.stopped ? `; stopped: ${training.stopped}` : ''}`);
  check(problems.length === 0, `ledger: ${head.height} blocks, ${records} records${problems.length ? `; ${problems.join('; ')}` : ', every block verifies'}`);
  check(cheaterCaught, `the cheater ${summary.cheater.joined ? (cheaterCaught ? `was caught after ${summary.cheater.caughtAfterS ?? '?'} s of the run` : 'was not caught') : 'never joined'}`);
  check(honestFlagged.length === 0, `honest workers flagged: ${honestFlagged.length ? honestFlagged.join(', ') : 'none'}`);
  check(summary.memory.every((m) => m.peakAccountShare <= 1), `memory accounts within budget (${MEMORY}): peak shares ${summary.memory.map((m) => m.peakAccountShare).join(', ')}; peak RSS ${summary.memory.map((m) => `${m.peakRssMiB}`).join(', ')} MiB`);
  log(`summary written to ${file}`);
} finally {
  clearInterval(sampler);
  for (const c of children) {
    c.kill('SIGCONT');
    c.kill('SIGKILL');
  }
  await Promise.all(users.map((u) => Promise.resolve(u.stop()).catch(() => {})));
  for (const h of homes) h.remove();
  mesh?.remove();
  rmSync(root, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
