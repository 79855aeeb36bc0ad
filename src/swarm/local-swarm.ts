import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { freshBuild } from '../../bin/fresh-build.js';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TensorLinkError } from '../errors.ts';
import type { CausalLM } from '../models/index.ts';
import { createNode, type TensorLinkNode } from '../p2p/index.ts';
import { type SwarmChain, startSwarmChain } from './local-chain.ts';
import { distribute, type DistributedJob, type DistributeOptions } from '../user/index.ts';

/**
 * How a node process is started: the CLI entry of the same code as this module. From dist/
 * that is dist/bundle/main.js (or dist/cli/main.js where the build made no bundle), run by
 * plain node. From the TypeScript sources it is the build of
 * this checkout when that build is no older than every source file (the same code, compiled:
 * about 2.5 s of CPU less per node than tsx), else src/cli/main.ts through tsx (found from this
 * package, not the caller's directory). Never bin/ and never a stale build: a checkout edited
 * since its last `npm run build` still launches the code that is running.
 */
export function nodeCommand(): string[] {
  if (!import.meta.url.endsWith('.ts')) {
    const bundle = fileURLToPath(new URL('../bundle/main.js', import.meta.url));
    return [existsSync(bundle) ? bundle : fileURLToPath(new URL('../cli/main.js', import.meta.url))];
  }
  const built = freshBuild(fileURLToPath(new URL('../..', import.meta.url)));
  if (built) return [built];
  return ['--import', import.meta.resolve('tsx'), fileURLToPath(new URL('../cli/main.ts', import.meta.url))];
}

/** A peer of the local swarm: its process, peer id and addresses. */
export interface LocalPeer {
  role: 'validator' | 'worker';
  process: ChildProcess;
  peerId: string;
  addrs: string[];
  /** Its Ethereum account (on a swarm with a chain). */
  account?: string;
  dashboard?: string;
}

export interface LocalSwarm {
  validator: LocalPeer;
  workers: LocalPeer[];
  /** The validator's address: what `--bootstrap` takes. */
  bootstrap: string;
  /** The local chain the swarm settles on (with `chain: true`). */
  chain: SwarmChain | null;
  /** The validator's dashboard (with `dashboard`), e.g. http://127.0.0.1:8080. */
  dashboard: string | null;
  /** A user node of this process in the swarm: `swarm.user.distribute(model)` plans and loads a job (a model or a checkpoint dir). */
  user: {
    node: TensorLinkNode;
    distribute(model: CausalLM | string, options?: DistributeOptions): Promise<DistributedJob>;
  };
  close(): Promise<void>;
}

/** A `tensorlink` node process that printed its {"event":"ready"} line. */
export interface NodeProcess {
  process: ChildProcess;
  peerId: string;
  addrs: string[];
  account?: string;
  /** Where its dashboard is served (a validator started with --dashboard). */
  dashboard?: string;
}

/** The tail of a node's stderr kept for the error that reports its exit. */
const KEPT_OUTPUT_CHARS = 16_384;

/**
 * Starts `tensorlink <args>` as its own process and waits for its ready line (typed errors
 * otherwise). `prefix` runs it through another command (`ip netns exec NS`: on another host).
 */
export function launchNode(args: string[], timeoutMs: number, options: { prefix?: string[] } = {}): Promise<NodeProcess> {
  const command = [...(options.prefix ?? []), process.execPath, ...nodeCommand(), ...args];
  const child = spawn(command[0], command.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new TensorLinkError(`tensorlink ${args[0]} did not start within ${timeoutMs} ms: ${err.trim()}`));
    }, timeoutMs);
    // what the node wrote last, for the error if it exits: a long-lived node's logs are not all kept here
    child.stderr?.on('data', (d) => {
      err = (err + d).slice(-KEPT_OUTPUT_CHARS);
    });
    let ready = false;
    child.stdout?.on('data', (d) => {
      if (ready) return;
      out += d;
      const line = out.split('\n').find((l) => l.includes('"event":"ready"'));
      if (line) {
        ready = true;
        out = '';
        clearTimeout(timer);
        const r = JSON.parse(line) as { peerId: string; addrs: string[]; account?: string; dashboard?: string };
        resolve({
          process: child, peerId: r.peerId, addrs: r.addrs, ...(r.account ? { account: r.account } : {}),
          ...(r.dashboard ? { dashboard: r.dashboard } : {}),
        });
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new TensorLinkError(`tensorlink ${args[0]} exited (${code}): ${err.trim()}`));
    });
  });
}

async function launch(role: 'validator' | 'worker', args: string[], timeoutMs: number): Promise<LocalPeer> {
  return { role, ...(await launchNode([role, ...args], timeoutMs)) };
}

/**
 * Starts a validator and `workers` workers on 127.0.0.1, each its own process, and stops
 * them all on `close()` or when this process exits (Ctrl-C included).
 * @example
 * const swarm = await localSwarm({ workers: 3 })
 * console.log(swarm.bootstrap)
 * await swarm.close()
 */
export async function localSwarm(options: {
  workers: number;
  memory?: string;
  /** A directory of Hugging Face checkpoints every worker holds (`worker --models`): loads of them move no weights. */
  models?: string;
  timeoutMs?: number;
  /** Stop the swarm and exit on SIGINT/SIGTERM (default); off when the caller handles signals itself. */
  handleSignals?: boolean;
  /** `--fault KIND[:RATE]` for the worker at each index (a cheater, to show the network's defences); undefined: honest. */
  faults?: (string | undefined)[];
  /** More arguments for the worker at each index (`--host NAME=DIR:FIRST-LAST`: what it hosts). */
  workerArgs?: (string[] | undefined)[];
  /** The compute backend of every node (default: each node's own default). */
  backend?: 'js' | 'ort';
  /**
   * onnxruntime threads per worker (default: the cores shared out among the workers and this
   * process, at least 1): nodes on one machine must not each spin a pool over every core.
   */
  threads?: number;
  /**
   * Start a local chain (anvil) too: the contracts deployed with the validator as the
   * settlement multisig, every worker funded and staking as it starts, the user funded.
   */
  chain?: boolean;
  /** Or join a chain that runs elsewhere: the deployment `tensorlink chain --out FILE` wrote (its nodes stake what their accounts hold). */
  joinChain?: { contracts: string; rpc?: string };
  /** Have the validator serve its dashboard at `[HOST:]PORT` (port 0: any free port). */
  dashboard?: string;
}): Promise<LocalSwarm> {
  const threads = options.threads ?? Math.max(1, Math.floor(availableParallelism() / (options.workers + 1)));
  const extra = [...(options.backend ? ['--backend', options.backend] : []), '--threads', String(threads), '--parent-pid', String(process.pid)];
  const timeoutMs = options.timeoutMs ?? 60_000;
  const dir = mkdtempSync(join(tmpdir(), 'tensorlink-swarm-'));
  const peers: LocalPeer[] = [];
  let chain: SwarmChain | null = null;
  const killAll = () => {
    for (const p of peers) if (p.process.exitCode === null && p.process.signalCode === null) p.process.kill('SIGTERM');
    if (chain && chain.local.process.exitCode === null) chain.local.process.kill('SIGTERM');
  };
  const onExit = () => killAll();
  const onSignal = () => {
    killAll();
    process.exit(130);
  };
  const handleSignals = options.handleSignals ?? true;
  process.once('exit', onExit);
  if (handleSignals) {
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
  }
  const close = async () => {
    process.off('exit', onExit);
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await Promise.all(
      peers.map(
        (p) =>
          new Promise<void>((resolve) => {
            if (p.process.exitCode !== null || p.process.signalCode !== null) return resolve();
            const force = setTimeout(() => p.process.kill('SIGKILL'), 5_000);
            p.process.once('exit', () => {
              clearTimeout(force);
              resolve();
            });
            p.process.kill('SIGTERM');
          }),
      ),
    );
    await chain?.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const workerDirs = Array.from({ length: options.workers }, (_, i) => join(dir, `worker-${i}`));
    if (options.chain) chain = await startSwarmChain(dir, join(dir, 'validator'), workerDirs);
    const joined = options.joinChain ? ['--contracts', options.joinChain.contracts, ...(options.joinChain.rpc ? ['--rpc', options.joinChain.rpc] : [])] : [];
    const onChain = chain ? ['--contracts', chain.file] : joined;
    const dashboard = options.dashboard === undefined ? [] : ['--dashboard', options.dashboard];
    const validator = await launch('validator', ['--data', join(dir, 'validator'), ...onChain, ...dashboard, ...extra], timeoutMs);
    peers.push(validator);
    const bootstrap = validator.addrs[0];
    const workers = await Promise.all(
      Array.from({ length: options.workers }, (_, i) =>
        launch('worker', [
          '--bootstrap', bootstrap, '--data', workerDirs[i], ...onChain,
          ...(options.memory ? ['--memory', options.memory] : []), ...(options.models ? ['--models', options.models] : []), ...extra,
          ...(options.faults?.[i] ? ['--fault', options.faults[i]!] : []), ...(options.workerArgs?.[i] ?? []),
        ], timeoutMs),
      ),
    );
    peers.push(...workers);
    const node = await createNode();
    const user = { node, distribute: (model: CausalLM | string, o?: DistributeOptions) => distribute(node, bootstrap, model, o) };
    return {
      validator,
      workers,
      bootstrap,
      chain,
      dashboard: validator.dashboard ?? null,
      user,
      close: async () => {
        await node.stop();
        await close();
      },
    };
  } catch (err) {
    await close();
    throw err;
  }
}
