import { type HostedModelEntry, MODEL_HOSTS_PER_ENTRY, pageOf, type PeerRecord } from '../p2p/index.ts';

/**
 * The model index: every (name, hash) the live workers host, in name order, with its hosts and its coverage, a page
 * from `cursor` (0 first; see pageOf); `next` is the following page's cursor when there is one.
 */
export function modelIndex(peers: readonly PeerRecord[], cursor = 0): { models: HostedModelEntry[]; next?: number } {
  const byModel = new Map<string, HostedModelEntry>();
  for (const p of peers) {
    if (p.excluded) continue;
    for (const h of p.hosts ?? []) {
      const key = `${h.name}\u0000${h.hash}`;
      let entry = byModel.get(key);
      if (!entry) {
        entry = { name: h.name, hash: h.hash, layers: h.blocks, complete: false, hosts: [] };
        byModel.set(key, entry);
      }
      const free = {
        ...(h.freeTokens === undefined ? {} : { freeTokens: h.freeTokens }),
        ...(h.throughput === undefined ? {} : { throughput: h.throughput }),
      };
      const sessions = h.sessions === undefined ? {} : { sessions: h.sessions };
      entry.hosts.push({ peerId: p.peerId, layers: h.layers, format: h.format, state: h.state, ...free, ...sessions });
    }
  }
  const all = [...byModel.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.hash < b.hash ? -1 : 1));
  for (const m of all) m.complete = covered(m);
  // a model of many hosts as several entries of MODEL_HOSTS_PER_ENTRY hosts each: no entry grows with the swarm
  const entries = all.flatMap((m) => Array.from({ length: Math.max(1, Math.ceil(m.hosts.length / MODEL_HOSTS_PER_ENTRY)) }, (_, i) => (
    { ...m, hosts: m.hosts.slice(i * MODEL_HOSTS_PER_ENTRY, (i + 1) * MODEL_HOSTS_PER_ENTRY) }
  )));
  const { items, next } = pageOf(entries, cursor);
  return next === undefined ? { models: items } : { models: items, next };
}

/** Whether every block of a model has an online host. */
function covered(m: HostedModelEntry): boolean {
  const held = new Array<boolean>(m.layers).fill(false);
  for (const h of m.hosts) {
    if (h.state !== 'online') continue;
    for (let b = h.layers[0]; b <= h.layers[1] && b < m.layers; b++) held[b] = true;
  }
  return held.every(Boolean);
}
