import { existsSync } from 'node:fs';
import { type DashboardServer, serveDashboard } from '../../serve/index.ts';
import { createLogger, createNode, parseStatusAnswer, type PathKind, publicKeyOf, reach, request } from '../../p2p/index.ts';
import { allModels, listModels, listPeers } from '../../user/index.ts';
import { startValidator } from '../../validator/index.ts';
import { LOCAL_GRANT, localSwarm } from '../../swarm/index.ts';
import { DEFAULT_DASHBOARD } from '../swarm.ts';
import { type Flags, hostPort, intFlag, parseBytes, requiredString, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';
import { chainFromFlags, USER_KEY_DIR } from '../chain-flags.ts';
import { announceFlags, logLevel, parseAddr, ready, runUntilSignal, validatorsFlag } from './node-process.ts';
import { loadOrCreateAccount } from '../../chain/index.ts';

/** `tensorlink swarm`: a validator and N workers on this machine, each its own process, until Ctrl-C. */
export async function swarmCommand(flags: Flags, out: Output): Promise<void> {
  const workers = intFlag(flags, 'workers', 3, 1);
  const memory = stringFlag(flags, 'memory');
  if (memory) parseBytes(memory);
  // a local chain (anvil) by default; --contracts FILE [--rpc URL] joins one that runs elsewhere; --no-chain: none
  const contracts = stringFlag(flags, 'contracts');
  const rpc = stringFlag(flags, 'rpc');
  if (flags['no-chain'] === true && (contracts || rpc)) throw new UsageError('--no-chain and --contracts/--rpc say opposite things: pick one');
  if (rpc && !contracts) throw new UsageError('--rpc needs --contracts FILE (what `tensorlink chain --out FILE` wrote)');
  if (contracts && !existsSync(contracts)) throw new UsageError(`--contracts ${contracts}: no such file (write one with tensorlink chain --out FILE)`);
  const asked = stringFlag(flags, 'dashboard');
  if (asked !== undefined && flags['no-dashboard'] === true) throw new UsageError('--dashboard and --no-dashboard say opposite things: pick one');
  if (asked !== undefined) hostPort(asked, 'dashboard');
  const dashboard = flags['no-dashboard'] === true
    ? undefined
    : asked ?? DEFAULT_DASHBOARD;
  const swarm = await localSwarm({
    workers, memory, handleSignals: false, chain: flags['no-chain'] !== true && !contracts, ...(dashboard === undefined ? {} : { dashboard }),
    // every node of the swarm computes on the backend asked for (main.ts checked it is js or ort)
    ...(flags.backend === 'js' || flags.backend === 'ort' ? { backend: flags.backend } : {}),
    ...(contracts ? { joinChain: { contracts, ...(rpc ? { rpc } : {}) } } : {}),
  });
  const chain = swarm.chain;
  // the account train and generate pay from (--contracts FILE --pay TLK) gets tokens too, before the swarm says it is ready
  const payer = chain ? loadOrCreateAccount(USER_KEY_DIR).address : null;
  try {
    if (chain && payer) await chain.fund(payer);
  } catch (err) {
    await swarm.close();
    throw err;
  }
  process.stdout.write(`${JSON.stringify({
    event: 'ready', bootstrap: swarm.bootstrap, validator: swarm.validator.peerId, workers: swarm.workers.map((w) => w.peerId),
    ...(chain ? { rpc: chain.deployment.rpc, chainId: chain.deployment.chainId, contracts: chain.deployment.contracts } : {}),
    ...(chain ? { contractsFile: chain.file, payer } : {}),
    ...(swarm.dashboard ? { dashboard: swarm.dashboard } : {}),
  })}\n`);
  out.info(`local swarm up: validator ${swarm.bootstrap} and ${workers} workers (Ctrl-C stops them all)`);
  if (swarm.dashboard) out.info(`dashboard: ${swarm.dashboard}/ (metrics for Prometheus at ${swarm.dashboard}/metrics)`);
  if (chain) {
    out.info(`local chain (anvil) at ${chain.deployment.rpc}: the contracts are in ${chain.file}; workers staked as they started; `
      + `your account ${payer} (key in ${USER_KEY_DIR}) holds ${tokens(LOCAL_GRANT)} to pay for jobs with --contracts ${chain.file}`);
  }
  if (contracts) out.info(`on the chain of ${contracts}: workers staked what their accounts held (a worker without stake is given no work)`);
  await runUntilSignal(swarm.close);
}

/** `tensorlink validator`: a bootstrap peer, DHT server and registry of workers. */
export async function validatorCommand(flags: Flags, out: Output): Promise<void> {
  const listen = stringFlag(flags, 'listen');
  if (listen) parseAddr(listen, 'listen');
  const level = logLevel(flags);
  const peers = (stringFlag(flags, 'peers') ?? '').split(',').map((p) => p.trim()).filter((p) => p !== '');
  for (const p of peers) parseAddr(p, 'peers');
  const validators = (stringFlag(flags, 'validators') ?? '').split(',').map((p) => p.trim()).filter((p) => p !== '');
  for (const v of validators) {
    try {
      publicKeyOf(v);
    } catch {
      throw new UsageError(`--validators: '${v}' is not a peer id (12D3KooW...)`);
    }
  }
  const threshold = intFlag(flags, 'threshold', 1, 1);
  const dataDir = stringFlag(flags, 'data');
  const chain = await chainFromFlags(flags, dataDir);
  const at = stringFlag(flags, 'dashboard');
  const where = at === undefined ? null : hostPort(at, 'dashboard');
  const v = await startValidator({
    // browser tabs reach it over WebRTC-direct or WebSockets, beside TCP
    browsers: true,
    dataDir, listen: listen ? [listen] : undefined, announce: announceFlags(flags), log: createLogger({ level, peer: 'validator' }), peers, validators, threshold, chain,
  });
  let dashboard: DashboardServer | null = null;
  if (where) {
    try {
      // the chain it settles on, for a tab to stake and claim on (its contracts and RPC, nothing secret)
      const d = chain?.deployment;
      const settlesOn = d ? { chain: { rpc: d.rpc, chainId: d.chainId, contracts: d.contracts } } : {};
      const validator = () => ({ peerId: v.node.peerId.toString(), addrs: v.node.getMultiaddrs().map(String), ...settlesOn });
      dashboard = await serveDashboard({ overview: async () => v.overview(), validator }, where);
    } catch (err) {
      await v.stop();
      throw new UsageError(`cannot serve the dashboard on ${where.host}:${where.port}: ${(err as Error).message}`);
    }
  }
  const addrs = v.node.getMultiaddrs().map(String);
  ready(v.node.peerId.toString(), addrs, chain?.address, dashboard?.url);
  out.info(`validator ${v.node.peerId.toString()} listening on ${addrs.join(', ')}`);
  if (dashboard) out.info(`dashboard: ${dashboard.url}/ (metrics for Prometheus at ${dashboard.url}/metrics)`);
  await runUntilSignal(async () => {
    await dashboard?.close();
    await v.stop();
  }, flags);
}

/** A token amount (18 decimals) for people: 123.456 TLK. */
export function tokens(units: string | bigint): string {
  const v = BigInt(units);
  const whole = v / 10n ** 18n;
  const frac = (v % 10n ** 18n).toString().padStart(18, '0').slice(0, 6).replace(/0+$/, '');
  return `${whole}${frac ? `.${frac}` : ''} TLK`;
}

function formatBytes(n: number): string {
  return n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(1)} GiB` : `${(n / 2 ** 20).toFixed(0)} MiB`;
}

/** `tensorlink status`: the swarm as its validator sees it. */
export async function statusCommand(flags: Flags, out: Output): Promise<void> {
  const bootstrap = validatorsFlag(requiredString(flags, 'bootstrap'));
  const node = await createNode();
  try {
    // every page, or (--page N: the `next` of an earlier answer) that one
    const one = flags.page === undefined ? null : parseStatusAnswer(await request(node, bootstrap, { type: 'status', page: intFlag(flags, 'page', 0, 0) }, 10_000));
    const peers = one ? one.peers : await listPeers(node, bootstrap, 10_000);
    const now = Date.now();
    const lines = peers.map((p) => {
      const c = p.capabilities;
      const memory = c && c.memoryFreeBytes !== undefined
        ? `${formatBytes(c.memoryBytes - c.memoryFreeBytes)} used, ${formatBytes(c.memoryFreeBytes)} free of ${formatBytes(c.memoryBytes)}`
        : c ? formatBytes(c.memoryBytes) : '';
      const caps = c ? `${c.gflops} GFLOP/s tier ${c.tier}, ${memory}, ${c.cores} cores, ${c.backend}` : '';
      const near = Object.entries(p.proximity ?? {}).map(
        ([peer, e]) => `\n    → ${peer.slice(-8)}  ${e.rttMs.toFixed(2)} ms round trip, ${e.mbps.toFixed(0)} Mbit/s${e.via ? ` (${PATH_NAMES[e.via]})` : ''}`,
      );
      const money = p.stake === undefined ? '' : `  stake ${tokens(p.stake)}, earned ${tokens(p.earned ?? '0')}, claimed ${tokens(p.claimed ?? '0')}`;
      const standing = p.reputation === undefined
        ? ''
        : `  reputation ${p.reputation.toFixed(2)} (${p.checks?.passed ?? 0} checks passed, ${p.checks?.failed ?? 0} failed)${p.excluded ? ' EXCLUDED' : ''}${money}`;
      const held = (p.sections ?? []).map((s) => `\n    holds layers [${s.layers[0]}, ${s.layers[1]}) in ${s.format}, ${formatBytes(s.bytes)}`);
      return `${p.peerId}  ${p.roles.join(',').padEnd(9)}  ${reach(p.addrs)}  ${caps}${standing}  seen ${((now - p.lastSeen) / 1000).toFixed(1)} s ago${held.join('')}${near.join('')}`;
    });
    if (one?.next !== undefined) lines.push(`more: --page ${one.next}`);
    out.result({ peers, ...(one?.next === undefined ? {} : { next: one.next }) }, lines.join('\n'));
  } finally {
    await node.stop();
  }
}

/** How `status` names the path a probe took. */
const PATH_NAMES: Record<PathKind, string> = { direct: 'direct', webrtc: 'direct WebRTC', relayed: 'through a relay' };

/** `tensorlink models`: the models the swarm hosts, each with its coverage and hosts, a page at a time. */
export async function modelsCommand(flags: Flags, out: Output): Promise<void> {
  const bootstrap = validatorsFlag(requiredString(flags, 'bootstrap'));
  const node = await createNode();
  try {
    // every page, a model's entries merged, or (--page N: the `next` of an earlier answer) that one as it is
    let answer: Awaited<ReturnType<typeof listModels>>;
    if (flags.page !== undefined) answer = await listModels(node, bootstrap, intFlag(flags, 'page', 0, 0));
    else answer = { models: await allModels(node, bootstrap) };
    const lines = answer.models.map((m) => {
      const hosts = m.hosts.map((h) => `\n    blocks ${h.layers[0]}-${h.layers[1]} on …${h.peerId.slice(-8)}  ${h.format}, ${h.state}${h.freeTokens === undefined ? '' : `, ${h.freeTokens} free KV tokens`}`);
      return `${m.name}  ${m.hash.slice(0, 12)}…  ${m.layers} blocks, ${m.complete ? 'every block served' : 'NOT every block served'}${hosts.join('')}`;
    });
    if (answer.next !== undefined) lines.push(`more: --page ${answer.next}`);
    out.result(answer, lines.length > 0 ? lines.join('\n') : 'no hosted models');
  } finally {
    await node.stop();
  }
}
