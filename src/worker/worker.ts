import type { WeightFormat } from '../tensor/index.ts';
import { chooseProbes, forgetOldest, PROBE_INTERVAL_MS, PROBES_PER_ROUND } from './probing.ts';
import { releaseBackendCopies } from './release.ts';
import type { NodeChain } from '../chain/index.ts';
import { origin, updateCoordinate } from '../plan/index.ts';
import type { RecordSigner } from '../verify/index.ts';
import { Claimer } from './claims.ts';
import { join } from 'node:path';
import { defaultCacheDir } from '../models/index.ts';
import {
  type Capabilities, createLogger, createNode, foldTransfer, listenAlso, type Logger, MAX_ANNOUNCED_PEERS, parseJobRequest,
  PAGE_ITEMS, parseStatusAnswer, PEERS_TOPIC, probe, type Proximity, relayListen, request, serveControl, serveProbes, SESSION_IDLE_MS,
  signerOf, stunServerOf, type TensorLinkNode,
  traffic, type TransferSample, Validators,
} from '../p2p/index.ts';
import { measureCapabilities } from './capabilities.ts';
import { ChunkStore } from './chunk-store.ts';
import { type Fault, FaultInjector } from './fault.ts';
import { AutoHost, type AutoHostOptions } from './auto-host.ts';
import { endsHandlers } from './ends-server.ts';
import { type HostSpec, hostModel } from './hosting.ts';
import { JobTable } from './jobs.ts';
import { MemoryBudget } from './memory.ts';
import { ModelIndex } from './model-index.ts';
import { type StageServer, serveStages } from './stage-server.ts';
import { StakeKeeper } from './stake.ts';

/** How often a worker refreshes its announcement (well inside the validator's 10 s TTL). */
export const ANNOUNCE_INTERVAL_MS = 2_000;

export interface Worker {
  node: TensorLinkNode;
  capabilities: Capabilities;
  /** The sections and sessions this worker serves. */
  stages: StageServer;
  /** What its jobs hold against what it offers. */
  memory: MemoryBudget;
  /** The jobs it serves (a page shows their sections). */
  jobs: JobTable;
  /** Its Ethereum account (with a chain). */
  account?: string;
  stop(): Promise<void>;
}

export interface WorkerOptions {
  bootstrap: string;
  dataDir?: string;
  listen?: string[];
  /** Addresses it announces besides its interfaces' (`--announce`: its router's public address and forwarded port). */
  announce?: string[];
  /** The most bytes of weight chunks it keeps under `dataDir` (default STORE_MAX_BYTES): the least recently used go first. */
  storeMaxBytes?: number;
  /** Addresses it announces instead of its interfaces' (see NodeOptions.advertise). */
  advertise?: string[];
  /** false: never take a slot on the validator's relay (by default it does when it is behind NAT: see relayListen). */
  relay?: boolean;
  /** Listen for browser tabs too: WebRTC-direct beside TCP (the CLI's worker does). */
  browsers?: boolean;
  memoryBytes?: number;
  /** On a worker that computes on a device (--backend webgpu): the memory it lends there (--gpu-memory); a section must fit both. */
  deviceMemoryBytes?: number;
  /** Hugging Face checkpoint directories this worker holds (`--models`): loads of their weights need no transfer. */
  modelsDir?: string;
  /** Named models it hosts for anyone (`--host [NAME=]PATH[:FIRST-LAST]`), loaded from its disk at start. */
  host?: HostSpec[];
  /**
   * `--host-auto`: it chooses what to host among the checkpoints under `modelsDir`, and moves where the swarm needs it
   * (see AutoHost); `blocks`, the wait and the check period may be set (tests).
   */
  hostAuto?: Omit<AutoHostOptions, 'models' | 'format'>;
  /** The format hosted models are held in (`--dtype bf16`, `--quantize int8|int4`; default float32). */
  hostFormat?: WeightFormat | null;
  /** Cheat on purpose (`--fault`): for testing the network's defences only. */
  fault?: Fault;
  /** How the worker tells the swarm about itself: a direct request to its validator, gossip, or both (default). */
  announceVia?: 'direct' | 'gossip' | 'both';
  /** How long a send waits for a peer that takes no bytes before that peer's stream is reset (default SEND_STALL_MS). */
  stallMs?: number;
  /** Stage requests one peer may send per second (`--max-requests`; default STAGE_MESSAGES_PER_SECOND). */
  requestsPerSecond?: number;
  log?: Logger;
  /** The chain it is paid on: it stakes what it needs to be given work, announces its account and claims its rewards. */
  chain?: NodeChain;
  /**
   * A node made elsewhere, in place of createNode's: a browser tab's (src/browser/), with the key it signs records with,
   * the capabilities it measured and the relay slot it listens on (announced as its only addresses).
   */
  own?: { node: TensorLinkNode; signer: RecordSigner; capabilities: Capabilities; circuit: string };
}

/**
 * A worker: measures its capabilities, dials its bootstrap validator, announces itself
 * and keeps announcing while alive (a lost validator is retried on the next tick), serves
 * the stage protocol for the jobs users open on it, and measures its links to other workers.
 */
export async function startWorker(options: WorkerOptions): Promise<Worker> {
  const log = options.log ?? createLogger({ level: 'silent' });
  const own = options.own;
  const capabilities = own?.capabilities ?? measureCapabilities(options.memoryBytes, options.deviceMemoryBytes);
  const memory = new MemoryBudget(capabilities.memoryBytes);
  // the checkpoints it holds are indexed (hashes cached in the data directory) before it offers itself
  const models = options.modelsDir
    ? await ModelIndex.build(options.modelsDir, options.dataDir ? join(options.dataDir, 'index') : defaultCacheDir(), log)
    : null;
  // behind a NAT (no public interface address, a validator on a public one): a slot on the validator's relay, which the
  // worker announces as its /p2p-circuit address, so that users and other workers reach it with nothing opened on its router
  const noRelay = options.relay === false || (options.announce?.length ?? 0) > 0 || (options.advertise?.length ?? 0) > 0;
  // `--bootstrap A,B,…`: control requests move on to the next validator when one is gone; the relay and STUN are the first's
  const validator = Validators.parse(options.bootstrap);
  const first = validator.current.toString();
  const circuit = own ? own.circuit : noRelay ? null : relayListen(first);
  // behind NAT it serves no DHT queries (nobody could dial it to ask): a DHT client
  const { dataDir, listen, announce: extra, advertise } = options;
  // the validator answers STUN: a WebRTC connection offers its router's public address and port to punch through
  const stun = stunServerOf(first);
  const browsers = options.browsers ? { websockets: false } : undefined;
  const node = own?.node
    ?? await createNode({ dataDir, listen, announce: extra, advertise, dhtClient: circuit !== null, stun: stun ? [stun] : [], browsers });
  const proximity: Record<string, Proximity> = {};
  // its network coordinate: moved by every probe's round trip to a peer that announced one (plan/vivaldi.ts)
  let coordinate = origin();
  // weight chunks persist in the data directory: a restarted worker is not sent what it holds
  const store = new ChunkStore(options.dataDir ? join(options.dataDir, 'chunks') : null, options.storeMaxBytes);
  // a job that ends returns all it held to the budget
  const jobs = new JobTable((gone) => {
    memory.release(gone.jobId);
    releaseBackendCopies(gone);
  });
  const fault = options.fault ? new FaultInjector(options.fault) : null;
  // the transfers other workers send it for their jobs update the link estimates between probes (passive measurement)
  const onTransfer = (peer: string, sample: TransferSample) => {
    const folded = foldTransfer(proximity[peer], sample);
    if (folded) proximity[peer] = folded;
    log.debug('link-measured', { remote: peer, bytes: sample.bytes, mbps: Math.round(sample.mbps * 10) / 10, estimate: folded?.inbound?.mbps });
  };
  const stages = await serveStages(node, jobs, {
    memory, store, models, stallMs: options.stallMs, signer: own?.signer ?? signerOf(node), fault, onTransfer,
    requestsPerSecond: options.requestsPerSecond,
  });
  // a new owner announced soon (defined below; a request before then needs none: the first announcement names it)
  let announceSoon: () => Promise<void> = async () => {};
  await serveControl(node, {
    'capabilities': () => ({ type: 'capabilities', capabilities: { ...capabilities, memoryFreeBytes: memory.free() } }),
    // its work and traffic so far, for summaries; jobs and sessions it holds, and its memory per job
    'stats': () => ({
      type: 'stats', work: stages.work(), bytesSent: traffic.sent, bytesReceived: traffic.received, jobs: jobs.size, sessions: stages.sessions(), memory: memory.report(),
    }),
    'proximity': () => ({ type: 'proximity', proximity }),
    ...endsHandlers(jobs), // a host's models' ends, config and tokenizer, for users without a checkpoint
    // Jobs: whoever opens one owns it; only the owner may drive or close it.
    'open-job': async (m, from) => {
      const known = circuit !== null && jobs.partners(node.peerId.toString(), MAX_ANNOUNCED_PEERS).includes(from.toString());
      const { jobId } = jobs.open(parseJobRequest(m).jobId, from);
      // behind NAT, a new owner is announced before the answer: the relay then carries its load as a job's
      if (circuit !== null && !known) await announceSoon();
      return { type: 'job-opened', jobId };
    },
    'job-status': (m, from) => {
      const job = jobs.authorize(parseJobRequest(m).jobId, from);
      return { type: 'job-status', job: { jobId: job.jobId, owner: job.owner, openedAt: job.openedAt, loaded: job.section !== undefined } };
    },
    'close-job': (m, from) => {
      const { jobId } = parseJobRequest(m);
      jobs.close(jobId, from);
      return { type: 'job-closed', jobId };
    },
  });
  await serveProbes(node);
  const sweeper = setInterval(() => stages.sweep(), SESSION_IDLE_MS / 4);
  const via = options.announceVia ?? 'both';
  let leaving = false;
  const announce = async () => {
    // each loaded section's layers, format and bytes (a job's id stays between its user and its workers)
    const sections = [...jobs.values()].flatMap((j) => (j.section && !j.hosted ? [{ layers: j.section.range, ...j.section.held }] : []));
    // each hosted span, with the KV-cache tokens its free memory still admits
    const hosts = [...jobs.values()].flatMap((j) => {
      if (!j.hosted || !j.section) return [];
      const perToken = j.section.model.layers.reduce((n, l) => n + l.profile().kvBytesPerToken, 0);
      const state = leaving ? { state: 'leaving' as const } : {};
      return [{ ...j.hosted, ...state, freeTokens: Math.floor(memory.free() / Math.max(1, perToken)), sessions: j.section.sessions.size }];
    });
    const record = {
      roles: ['worker'], capabilities: { ...capabilities, memoryFreeBytes: memory.free() }, addrs: node.getMultiaddrs().map(String), proximity,
      coordinate,
      ...(sections.length > 0 ? { sections } : {}),
      ...(hosts.length > 0 ? { hosts } : {}),
      ...(options.chain ? { account: options.chain.address } : {}),
      at: Date.now(),
    };
    if (via !== 'direct') {
      await node.services.pubsub.publish(PEERS_TOPIC, new TextEncoder().encode(JSON.stringify(record)));
    }
    // behind NAT: whom it works with, so the relay carries their traffic as a job's (to the validator only, not gossiped)
    const peers = circuit ? { peers: jobs.partners(node.peerId.toString(), MAX_ANNOUNCED_PEERS) } : {};
    if (via !== 'gossip') await request(node, validator, { type: 'announce', ...record, ...peers });
  };
  // new owners share one announcement made after they came (the one under way may predate them: the next one, queued
  // behind it, is shared by all who come meanwhile), and none waits more than 2 s for it
  let running: Promise<void> = Promise.resolve();
  let queued: Promise<void> | null = null;
  announceSoon = async () => {
    queued ??= running.then(() => {
      queued = null;
      return announce().catch((err: Error) => log.warn('announce-failed', { error: err.message }));
    });
    running = queued;
    await Promise.race([queued, new Promise((r) => setTimeout(r, 2_000))]);
  };
  if (via === 'gossip') await node.dial(validator.current, { signal: AbortSignal.timeout(10_000) });
  /**
   * Measures round trip and bandwidth to PROBES_PER_ROUND other workers a round, at any of their addresses: of a page of
   * the registry (the first, then one at random once the registry's size is known, so that a large swarm's probes
   * spread over it rather than all landing on its first hundred), those it works with first, then the longest unprobed.
   */
  let registrySize = 0;
  const measure = async () => {
    const page = registrySize > PAGE_ITEMS ? Math.floor(Math.random() * registrySize) : 0;
    const answer = parseStatusAnswer(await request(node, validator, { type: 'status', page }));
    trustValidators();
    registrySize = answer.total ?? answer.peers.length;
    const me = node.peerId.toString();
    for (const peer of chooseProbes(answer.peers, me, new Set(jobs.partners(me, PROBES_PER_ROUND)), proximity)) {
      try {
        const measured = await probe(node, peer);
        if (peer.coordinate) coordinate = updateCoordinate(coordinate, peer.coordinate, measured.rttMs);
        // a probe renews this peer's way there; what its transfers measured the other way stays
        const inbound = proximity[peer.peerId]?.inbound;
        proximity[peer.peerId] = inbound ? { ...measured, inbound } : measured;
        forgetOldest(proximity);
      } catch (err) {
        log.debug('probe-failed', { remote: peer.peerId, error: (err as Error).message });
      }
    }
  };
  // with a chain: stake from its own tokens (a worker without stake is given no work), again at each
  // announcement while it holds less than the minimum (funded later, or slashed), and claim what it earns
  const stake = options.chain ? new StakeKeeper(options.chain, log) : null;
  await stake?.check();
  const claimer = options.chain ? new Claimer(node, validator, options.chain, log) : null;
  claimer?.start();
  // the models it hosts are loaded (and hashed) before it offers them
  const self = node.peerId.toString();
  // its validators re-run sampled steps of hosted sessions, as they do jobs': those it was given, and those it learns of
  // from their status answers (each hosted span's job trusts them as they come)
  const verifiers: string[] = [];
  const trustValidators = () => {
    for (const id of validator.ids()) {
      if (verifiers.includes(id)) continue;
      verifiers.push(id);
      for (const j of jobs.values()) if (j.hosted) j.verifiers.add(id);
    }
  };
  trustValidators();
  const hostCtx = { jobs, memory, self, log, gflops: capabilities.gflops, verifiers, fault };
  for (const spec of options.host ?? []) await hostModel(spec, options.hostFormat ?? null, hostCtx);
  await announce();
  // the slot is taken once the validator knows it as a worker (its relay serves only peers it knows); then announced again
  if (circuit) {
    await listenAlso(node, circuit);
    // and /webrtc over it: a peer signals a direct WebRTC connection through the relayed one (dialProtocol tries it first)
    await listenAlso(node, '/webrtc').catch((err) => log.warn('webrtc-unavailable', { error: (err as Error).message }));
    log.info('relayed', { via: circuit });
    await announce();
  }
  const autoHost = options.hostAuto
    ? new AutoHost({ ...options.hostAuto, models: models?.models ?? [], format: options.hostFormat ?? null }, {
        jobs, memory, self, log, gflops: capabilities.gflops, verifiers, validator, announce,
        ask: (target, message) => request(node, target, message),
      })
    : null;
  await autoHost?.start();
  let stopped = false;
  // a relay that restarts drops the slot (and the relayed address with it): taken again once the validator answers
  let reserving = false;
  const keepSlot = async () => {
    if (!circuit || reserving || node.getMultiaddrs().some((a) => a.toString().includes('/p2p-circuit'))) return;
    reserving = true;
    try {
      await listenAlso(node, circuit);
      log.info('relayed-again', { via: circuit });
    } catch (err) {
      log.debug('relay-slot-failed', { error: (err as Error).message });
    } finally {
      reserving = false;
    }
  };
  // one announcement at a time: with every validator gone, one walks them all (each a dial's timeout), and another
  // started meanwhile would only pile up behind it
  let announcing = false;
  const timer = setInterval(() => {
    if (stopped) return;
    void stake?.check();
    if (announcing) return;
    announcing = true;
    void keepSlot().then(() => announce()).catch((err: Error) => log.warn('announce-failed', { error: err.message }))
      .finally(() => (announcing = false));
  }, ANNOUNCE_INTERVAL_MS);
  const firstProbe = setTimeout(() => void measure().catch((err: Error) => log.debug('measure-failed', { error: err.message })), ANNOUNCE_INTERVAL_MS);
  const probeTimer = setInterval(() => {
    if (!stopped) measure().catch((err: Error) => log.debug('measure-failed', { error: err.message }));
  }, PROBE_INTERVAL_MS);
  return {
    node,
    capabilities,
    stages,
    memory,
    jobs,
    ...(options.chain ? { account: options.chain.address } : {}),
    stop: async () => {
      stopped = true;
      autoHost?.stop();
      // hosts say they are leaving, so that users route new sessions elsewhere at once
      if ((options.host ?? []).length > 0 || autoHost) {
        leaving = true;
        await announce().catch(() => {});
      }
      claimer?.stop();
      clearInterval(timer);
      clearInterval(probeTimer);
      clearInterval(sweeper);
      clearTimeout(firstProbe);
      await node.stop();
      models?.close();
    },
  };
}
