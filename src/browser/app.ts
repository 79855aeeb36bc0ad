// The /lend page: the tab's own libp2p node dials the validator that served the page (WebRTC-direct first, then
// WebSockets) and reads the swarm's registry with the control protocol, as any peer does; the visitor chooses how much
// memory to lend and the tab becomes a worker (lend.ts). `?start=1&memory=256MiB` starts at once. Bundled by esbuild
// for the browser (scripts/build-dashboard.mjs); nothing is fetched at run time but what the validator serves.
import './globals.ts';
import { chooseEngine } from './engine-choice.ts';
import { peerConnectionsCreated, RTC_BUDGET } from './rtc-budget.ts';
import type { Connection, Libp2p, PrivateKey } from '@libp2p/interface';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { parseFault } from '../worker/index.ts';
import { formatEther } from 'viem';
import type { Deployment } from '../chain/index.ts';
import type { WorkSnapshot } from './bridge-protocol.ts';
import { tabAccountKey, tabIdentity } from './keys.ts';
import { lend, tabNode, type TabWorker } from './lend.ts';
import { parseStatusAnswer, type PeerRecord, reach, request } from '../p2p/index.ts';

/** Set by the bundler: true only in the test build (dist/lend-test/), which alone honours `?fault=`. */
declare const TENSORLINK_TEST_BUILD: boolean;

const REFRESH_MS = 2_000;
/** How long one of the validator's addresses may take to answer before the next is tried. */
const DIAL_MS = 10_000;
const $ = (id: string) => document.getElementById(id)!;

/** The host part of an address (`/ip4/H/…`, `/dns4/H/…`), or null. */
function hostOf(ma: Multiaddr): string | null {
  return ma.getComponents().find((c) => ['ip4', 'ip6', 'dns', 'dns4', 'dns6'].includes(c.name))?.value ?? null;
}

/**
 * The tab dials only the swarm: the validator that served it and the hosts its registry lists, loopback and private
 * ranges included (a swarm on one machine or a LAN is a real use); anything else is refused.
 */
const allowedHosts = new Set<string>();
const allow = (ma: Multiaddr) => {
  const host = hostOf(ma);
  if (host !== null) allowedHosts.add(host);
};

/** Who the tab joins: the validator's peer id and addresses, and the chain its swarm settles on (if any). */
interface ValidatorInfo {
  peerId: string;
  addrs: string[];
  chain?: Deployment;
}

/**
 * The validator to join: `?validator=ADDR` (repeatable; the page built as static files and served from anywhere), else
 * the one that served the page (validator.json beside it).
 */
async function validatorToDial(): Promise<ValidatorInfo> {
  const given = new URLSearchParams(location.search).getAll('validator');
  if (given.length === 0) return (await (await fetch(new URL('validator.json', import.meta.url))).json()) as ValidatorInfo;
  const peerId = multiaddr(given[0]).getComponents().find((c) => c.name === 'p2p')?.value;
  if (!peerId) throw new Error(`?validator= must end in /p2p/<its peer id>: ${given[0]}`);
  return { peerId, addrs: given };
}

async function start(): Promise<void> {
  const validator = await validatorToDial();
  const addrs = validator.addrs.map((a) => multiaddr(a));
  for (const a of addrs) allow(a);
  const { key, kept } = await tabIdentity();
  const node = await tabNode(key, (ma: Multiaddr) => {
    const host = hostOf(ma);
    return host === null || !allowedHosts.has(host);
  });
  $('self').textContent = `this tab: ${node.peerId.toString()}${kept ? ' (its key is kept in this browser)' : ' (a key for this visit: IndexedDB refused)'}`;
  $('self').dataset.peer = node.peerId.toString();
  // WebRTC-direct first (no TLS certificate needed: the address carries its hash), WebSockets next
  const ordered = [...addrs.filter((a) => a.toString().includes('/webrtc-direct/')), ...addrs.filter((a) => a.toString().includes('/ws/'))];
  if (ordered.length === 0) throw new Error('the validator listens for no browser transport (WebRTC-direct or WebSockets)');
  // one at a time, in this order (libp2p's own order would take WebSockets first)
  let conn: Connection | null = null;
  const failures: string[] = [];
  for (const a of ordered) {
    try {
      conn = await node.dial(a, { signal: AbortSignal.timeout(DIAL_MS) });
      break;
    } catch (err) {
      failures.push(`${a.toString()}: ${(err as Error).message}`);
    }
  }
  if (!conn) throw new Error(`no address of the validator answered: ${failures.join('; ')}`);
  if (failures.length > 0) console.warn('the tab could not dial', failures);
  $('via').textContent = `connected to the validator over ${conn.remoteAddr.toString().includes('/webrtc-direct') ? 'webrtc-direct' : 'websockets'}: ${conn.remoteAddr.toString()}`;
  const reached = conn.remoteAddr.toString().includes('/p2p/') ? conn.remoteAddr : conn.remoteAddr.encapsulate(`/p2p/${validator.peerId}`);
  offerLending(node, key, reached, validator.chain ?? null);
  // a tab that closes (or navigates away) ends its connections at once, so that its peers, and the jobs it served, know
  // now rather than when WebRTC's consent checks time out (tens of seconds)
  addEventListener('pagehide', () => {
    for (const c of node.getConnections()) c.abort(new Error('the tab is closing'));
  });
  const refresh = async () => {
    try {
      await show(node, conn.remoteAddr);
    } catch (err) {
      // a peer's words are text, never markup
      $('status').replaceChildren(errorSpan(`the validator did not answer: ${(err as Error).message}`));
    }
    setTimeout(() => void refresh(), REFRESH_MS);
  };
  await refresh();
}

async function show(node: Libp2p, validator: Multiaddr): Promise<void> {
  const { peers } = parseStatusAnswer(await request(node, validator, { type: 'status' }));
  const workers = peers.filter((p) => p.roles.includes('worker'));
  for (const w of workers) for (const a of w.addrs) allow(multiaddr(a));
  $('status').innerHTML = `<span class="ok">connected</span> · ${peers.length} peers in the registry, ${new Date().toLocaleTimeString()}`;
  $('count').textContent = String(workers.length);
  const body = document.querySelector('table[data-testid="workers"] tbody')!;
  body.replaceChildren(...workers.map((w) => row(w, w.peerId === node.peerId.toString())));
}

function row(w: PeerRecord, self: boolean): HTMLTableRowElement {
  const c = w.capabilities;
  const mib = (n: number) => `${(n / 2 ** 20).toFixed(0)} MiB`;
  const tr = tableRow([
    `…${w.peerId.slice(-10)}${self ? ' (this tab)' : ''}`, reach(w.addrs), c ? `${c.backend}, ${c.cores} cores` : '', c ? c.gflops.toFixed(1) : '',
    c ? `${mib(c.memoryFreeBytes ?? c.memoryBytes)} / ${mib(c.memoryBytes)}` : '', String(w.sections?.length ?? 0),
  ]);
  tr.dataset.peer = w.peerId;
  return tr;
}

/** A table row of text cells (a peer's words are text, never markup). */
function tableRow(cells: string[]): HTMLTableRowElement {
  const tr = document.createElement('tr');
  for (const text of cells) {
    const td = document.createElement('td');
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

/** What the tab's engine measured: the js backend's speed, the WebAssembly GEMM's where this browser runs it, the GPU's where it has one. */
interface EngineMeasured {
  gflops: number;
  wasmGflops?: number;
  /** The GPU's adapter and speed (browser-webgpu), or why there is none. */
  webgpu?: string;
  webgpuGflops?: number;
  webgpuError?: string;
}

/**
 * Runs TensorLink's engine in a Web Worker: its speed on the js backend (and with the WebAssembly GEMM), and the
 * fingerprint (SHA-256) of the seeded reference forward's logits, which equals a Node worker's when the engine computes
 * the same bytes here (the WebAssembly GEMM's too).
 */
function measureEngine(): Promise<EngineMeasured> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(new URL('engine.js', import.meta.url), { type: 'module' });
    type Measured = EngineMeasured & { logitsSha256?: string; wasmSha256?: string; ms?: number; error?: string };
    worker.onmessage = (evt: MessageEvent<Measured>) => {
      const r = evt.data;
      worker.terminate();
      if (r.error !== undefined) {
        $('engine').replaceChildren(errorSpan(`the engine failed: ${r.error}`));
        reject(new Error(r.error));
        return;
      }
      const wasm = r.wasmGflops === undefined
        ? '; WebAssembly SIMD is not available in this browser'
        : `; with its GEMM in WebAssembly SIMD (browser-wasm): ${r.wasmGflops.toFixed(2)} GFLOP/s`
          + `${r.wasmSha256 === r.logitsSha256 ? ', the same logits to the bit' : ', OTHER LOGITS: not used'}`;
      const gpu = r.webgpu === undefined
        ? `; no GPU (browser-webgpu): ${r.webgpuError ?? 'not measured'}`
        : `; its GPU (browser-webgpu, onnxruntime-web's WebGPU provider on ${r.webgpu}): ${r.webgpuGflops!.toFixed(2)} GFLOP/s`;
      $('engine').textContent = `js backend in a Web Worker: ${r.gflops.toFixed(2)} GFLOP/s (256³ matrix product)${wasm}${gpu}`;
      if (r.webgpu !== undefined) $('engine').dataset.webgpu = r.webgpu;
      $('engine').dataset.gflops = String(r.gflops);
      if (r.wasmGflops !== undefined) $('engine').dataset.wasmGflops = String(r.wasmGflops);
      $('fingerprint').textContent = `reference forward (seeded Llama, 8 tokens) in ${r.ms!.toFixed(0)} ms, logits SHA-256 ${r.logitsSha256}`;
      $('fingerprint').dataset.sha256 = r.logitsSha256;
      if (r.wasmSha256 !== undefined) $('fingerprint').dataset.wasmSha256 = r.wasmSha256;
      // the WebAssembly GEMM only where it gave the js backend's logits exactly
      const gpuMeasured = r.webgpu === undefined ? {} : { webgpu: r.webgpu, webgpuGflops: r.webgpuGflops };
      resolve({ gflops: r.gflops, ...(r.wasmSha256 === r.logitsSha256 ? { wasmGflops: r.wasmGflops } : {}), ...gpuMeasured });
    };
  });
}

function errorSpan(text: string): HTMLSpanElement {
  const e = document.createElement('span');
  e.className = 'err';
  e.textContent = text;
  return e;
}

/** `256MiB`, `1GiB`, `512` (MiB): bytes, or null. */
function parseMemory(text: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|)\s*$/i.exec(text);
  if (!m) return null;
  const unit = { 'kib': 2 ** 10, 'mib': 2 ** 20, 'gib': 2 ** 30, '': 2 ** 20 }[m[2].toLowerCase() as 'kib' | 'mib' | 'gib' | ''];
  const bytes = Math.floor(Number(m[1]) * unit);
  return bytes > 0 ? bytes : null;
}

const engine = measureEngine();

/** The lend panel: how much memory, and start (at once with `?start=1`). */
function offerLending(node: Libp2p, key: PrivateKey, validator: Multiaddr, deployment: Deployment | null): void {
  const params = new URLSearchParams(location.search);
  const input = $('memory') as HTMLInputElement;
  if (params.has('memory')) input.value = params.get('memory')!;
  const button = $('start') as HTMLButtonElement;
  button.disabled = false;
  const go = async () => {
    const memoryBytes = parseMemory(input.value);
    if (memoryBytes === null) {
      $('lend-state').replaceChildren(errorSpan(`'${input.value}' is not an amount of memory (e.g. 256MiB, 1GiB)`));
      return;
    }
    // a tab cannot lend more than its JavaScript heap holds (Chrome says how much; other browsers do not)
    const heap = (performance as unknown as { memory?: { jsHeapSizeLimit: number } }).memory?.jsHeapSizeLimit;
    if (heap !== undefined && memoryBytes > heap * 0.75) {
      const most = `${Math.floor((heap * 0.75) / 2 ** 20)} MiB`;
      $('lend-state').replaceChildren(errorSpan(`this tab can lend at most ${most} (three quarters of its JavaScript heap), not ${input.value}`));
      return;
    }
    button.disabled = true;
    input.disabled = true;
    $('lend-state').textContent = 'measuring the engine, then joining…';
    try {
      const fault = TENSORLINK_TEST_BUILD && params.has('fault') ? parseFault(params.get('fault')!) : undefined;
      // on a chain, the tab's account (its key kept beside its identity) stakes and is paid
      const account = deployment ? await tabAccountKey() : null;
      if (deployment && !account) throw new Error('this swarm pays on a chain, and this browser keeps no account key for the tab (IndexedDB refused)');
      const chain = deployment && account ? { chain: { deployment, key: account } } : {};
      // the GPU where it is faster than the CPU's engine, else the WebAssembly GEMM where it runs (`?engine=` chooses)
      const speed = chooseEngine(await engine, params.get('engine'));
      const worker = await lend(node, key, { memoryBytes, ...speed, validator, ...(fault ? { fault } : {}), ...chain });
      showWork(worker);
    } catch (err) {
      $('lend-state').replaceChildren(errorSpan(`the tab could not join as a worker: ${(err as Error).message}`));
      button.disabled = false;
      input.disabled = false;
    }
  };
  button.onclick = () => void go();
  if (params.get('start') === '1') void go();
}

/** What the tab's worker is doing, refreshed every second: its addresses, jobs, sections and what it computed. */
function showWork(worker: TabWorker): void {
  const mib = (n: number) => `${(n / 2 ** 20).toFixed(1)} MiB`;
  const draw = () => {
    const addrs = worker.node.getMultiaddrs().map(String);
    const lending = $('lending');
    lending.dataset.state = addrs.some((a) => a.includes('/p2p-circuit')) ? 'serving' : 'joining';
    lending.dataset.backend = worker.backend;
    lending.dataset.rtc = String(peerConnectionsCreated());
    const rtc = addrs.some((a) => a.includes('/webrtc/')) ? ' and WebRTC' : '';
    $('lend-state').textContent = lending.dataset.state === 'serving'
      ? `serving as a worker (reached through the validator's relay${rtc}), computing in a Web Worker on ${worker.backend}`
      : 'joining: waiting for a slot on the validator\'s relay';
    if (worker.failed) {
      lending.dataset.state = 'failed';
      $('lend-state').replaceChildren(errorSpan(`${worker.failed}: this tab no longer serves (reload the page to lend again)`));
      return;
    }
    const s = worker.snapshot;
    if (!s) return;
    const w = s.work;
    lending.dataset.sections = String(s.sections.length);
    lending.dataset.steps = String(w.forwards + w.trainForwards + w.trainBackwards + w.optimizerSteps);
    $('lend-memory').textContent = `memory: ${mib(s.memory.used)} held of ${mib(s.memory.total)} lent; `
      + `WebRTC connections created: ${peerConnectionsCreated()} of the ${RTC_BUDGET} this tab allows itself`;
    $('lend-work').textContent = `served: ${w.forwards} inference forwards, ${w.trainForwards} training forwards, `
      + `${w.trainBackwards} backwards, ${w.optimizerSteps} optimizer steps; ${mib(w.weightBytesReceived)} of weights received`;
    showEarnings(s.chain);
    const body = document.querySelector('table[data-testid="sections"] tbody')!;
    body.replaceChildren(...s.sections.map((x) => tableRow([
      x.job.slice(0, 12), x.arch, `layers ${x.range[0]}–${x.range[1] - 1}`, x.format, mib(x.bytes), String(x.sessions),
    ])));
  };
  draw();
  setInterval(draw, 1_000);
}

/** The tab's account on the chain: its stake (or what to do without one) and what it has claimed. */
function showEarnings(chain: WorkSnapshot['chain']): void {
  const el = $('lend-earnings');
  if (!chain) {
    el.textContent = 'earnings: this swarm settles on no chain, so there is nothing to claim';
    return;
  }
  el.dataset.account = chain.account;
  if ('error' in chain) {
    el.replaceChildren(errorSpan(`account ${chain.account}: the chain could not be read: ${chain.error}`));
    return;
  }
  const tlk = (wei: string) => `${formatEther(BigInt(wei))} TLK`;
  const staked = BigInt(chain.stake) >= BigInt(chain.minStake);
  el.dataset.staked = String(staked);
  el.dataset.claimed = chain.claimed;
  if (staked) {
    el.textContent = `account ${chain.account}: ${tlk(chain.stake)} staked; earned and claimed ${tlk(chain.claimed)}; ${tlk(chain.tokens)} besides`;
    return;
  }
  // funding the tab's account is the visitor's business: say what it lacks
  const gas = BigInt(chain.gas) === 0n ? ' and no ether for gas' : '';
  el.replaceChildren(errorSpan(`no stake: account ${chain.account} holds ${tlk(chain.tokens)}${gas}; a worker is given work once `
    + `${tlk(chain.minStake)} of it are staked. Send it tokens and a little ether: the tab stakes by itself.`));
}

start().catch((err: unknown) => {
  $('status').replaceChildren(errorSpan(`cannot reach the swarm: ${(err as Error).message}`));
});
