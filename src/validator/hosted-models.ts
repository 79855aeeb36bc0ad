import type { HostedModelEntry, PeerRecord } from '../p2p/index.ts';

/** Models one page of the model index lists. */
export const MODELS_PAGE_SIZE = 100;

/**
 * The model index: every (name, hash) the live workers host, in name order, with its hosts and its coverage,
 * `MODELS_PAGE_SIZE` to a page from `page` (0 first); `next` is the following page when there is one.
 */
export function modelIndex(peers: readonly PeerRecord[], page = 0): { models: HostedModelEntry[]; next?: number } {
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
      const free = h.freeTokens === undefined ? {} : { freeTokens: h.freeTokens };
      entry.hosts.push({ peerId: p.peerId, layers: h.layers, format: h.format, state: h.state, ...free });
    }
  }
  const all = [...byModel.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.hash < b.hash ? -1 : 1));
  for (const m of all) m.complete = covered(m);
  const models = all.slice(page * MODELS_PAGE_SIZE, (page + 1) * MODELS_PAGE_SIZE);
  return (page + 1) * MODELS_PAGE_SIZE < all.length ? { models, next: page + 1 } : { models };
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
