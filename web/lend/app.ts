// The /lend page: the tab's own libp2p node dials the validator that served the page (WebRTC-direct first, then
// WebSockets) and reads the swarm's registry with the control protocol, as any peer does. Bundled by esbuild for the
// browser (scripts/build-dashboard.mjs); nothing is fetched at run time but what the validator serves.
import { identify } from '@libp2p/identify';
import type { Connection, Libp2p } from '@libp2p/interface';
import { noise } from '@libp2p/noise';
import { webRTCDirect } from '@libp2p/webrtc';
import { webSockets } from '@libp2p/websockets';
import { yamux } from '@libp2p/yamux';
import { type Multiaddr, multiaddr } from '@multiformats/multiaddr';
import { createLibp2p } from 'libp2p';
import { request } from '../../src/p2p/protocols/control/client.ts';
import { parseStatusAnswer } from '../../src/p2p/protocols/control/schema.ts';
import { reach } from '../../src/p2p/reach.ts';
import { tabIdentity } from './keys.ts';
import type { PeerRecord } from '../../src/p2p/vocabulary.ts';

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

async function start(): Promise<void> {
  const validator = (await (await fetch('/lend/validator.json')).json()) as { peerId: string; addrs: string[] };
  const addrs = validator.addrs.map((a) => multiaddr(a));
  for (const a of addrs) allow(a);
  const { key, kept } = await tabIdentity();
  const node = await createLibp2p({
    privateKey: key,
    transports: [webRTCDirect(), webSockets()],
    connectionEncrypters: [noise()],
    streamMuxers: [yamux()],
    services: { identify: identify() },
    connectionGater: {
      denyDialMultiaddr: (ma: Multiaddr) => {
        const host = hostOf(ma);
        return host === null || !allowedHosts.has(host);
      },
    },
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
  const refresh = async () => {
    try {
      await show(node, conn.remoteAddr);
    } catch (err) {
      $('status').innerHTML = `<span class="err">the validator did not answer: ${(err as Error).message}</span>`;
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
  body.replaceChildren(...workers.map(row));
}

function row(w: PeerRecord): HTMLTableRowElement {
  const tr = document.createElement('tr');
  tr.dataset.peer = w.peerId;
  const c = w.capabilities;
  const mib = (n: number) => `${(n / 2 ** 20).toFixed(0)} MiB`;
  const cells = [
    `…${w.peerId.slice(-10)}`, reach(w.addrs), c ? `${c.backend}, ${c.cores} cores` : '', c ? c.gflops.toFixed(1) : '',
    c ? `${mib(c.memoryFreeBytes ?? c.memoryBytes)} / ${mib(c.memoryBytes)}` : '', String(w.sections?.length ?? 0),
  ];
  for (const text of cells) {
    const td = document.createElement('td');
    td.textContent = text;
    tr.append(td);
  }
  return tr;
}

/**
 * Runs TensorLink's engine in a Web Worker: its speed on the js backend, and the fingerprint (SHA-256) of the seeded
 * reference forward's logits, which equals a Node worker's when the engine computes the same bytes here.
 */
function measureEngine(): void {
  const worker = new Worker('/lend/engine.js', { type: 'module' });
  worker.onmessage = (evt: MessageEvent<{ gflops?: number; logitsSha256?: string; ms?: number; error?: string }>) => {
    const r = evt.data;
    if (r.error !== undefined) $('engine').innerHTML = `<span class="err">the engine failed: ${r.error}</span>`;
    else {
      $('engine').textContent = `js backend in a Web Worker: ${r.gflops!.toFixed(2)} GFLOP/s (256³ matrix product)`;
      $('engine').dataset.gflops = String(r.gflops);
      $('fingerprint').textContent = `reference forward (seeded Llama, 8 tokens) in ${r.ms!.toFixed(0)} ms, logits SHA-256 ${r.logitsSha256}`;
      $('fingerprint').dataset.sha256 = r.logitsSha256;
    }
    worker.terminate();
  };
}

measureEngine();
start().catch((err: unknown) => {
  $('status').innerHTML = '';
  const e = document.createElement('span');
  e.className = 'err';
  e.textContent = `cannot reach the swarm: ${(err as Error).message}`;
  $('status').append(e);
});
