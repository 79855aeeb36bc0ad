// The tab's identity: an Ed25519 key kept in the tab's IndexedDB, so that the same browser is the same peer (its
// records, its reputation and, with a chain, its account) from one visit to the next. Made on the first visit.
import { generateKeyPair, privateKeyFromProtobuf, privateKeyToProtobuf } from '@libp2p/crypto/keys';
import type { PrivateKey } from '@libp2p/interface';

const DB = 'tensorlink';
const STORE = 'keys';

function open(): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const req = indexedDB.open(DB, 1);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE);
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error ?? new Error('IndexedDB did not open'));
  });
}

function run<T>(db: IDBDatabase, mode: IDBTransactionMode, act: (s: IDBObjectStore) => IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    const req = act(db.transaction(STORE, mode).objectStore(STORE));
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error ?? new Error('IndexedDB refused the request'));
  });
}

/**
 * What IndexedDB keeps under `name`, or what `make` makes, stored there; null when IndexedDB refuses (a private window
 * may).
 */
async function kept<T>(name: string, make: () => Promise<T>): Promise<T | null> {
  let db: IDBDatabase;
  try {
    db = await open();
  } catch {
    return null;
  }
  try {
    const stored = await run<T | undefined>(db, 'readonly', (s) => s.get(name) as IDBRequest<T | undefined>);
    if (stored !== undefined) return stored;
    const value = await make();
    await run(db, 'readwrite', (s) => s.put(value, name));
    return value;
  } finally {
    db.close();
  }
}

/** The tab's key: the one IndexedDB holds, or a new one, stored. Without IndexedDB (a private window may refuse it), a key for this visit. */
export async function tabIdentity(): Promise<{ key: PrivateKey; kept: boolean }> {
  const stored = await kept('identity', async () => privateKeyToProtobuf(await generateKeyPair('Ed25519')));
  if (stored === null) return { key: await generateKeyPair('Ed25519'), kept: false };
  return { key: privateKeyFromProtobuf(new Uint8Array(stored)), kept: true };
}

/**
 * The tab's Ethereum account key (hex), kept beside its identity: where a swarm settles on a chain, what the tab earns is
 * paid to it and its stake is locked from it. Made on the first visit to such a swarm; null without IndexedDB (an
 * account whose key is lost with the visit would lose what it earned).
 */
export function tabAccountKey(): Promise<`0x${string}` | null> {
  const random = () => `0x${[...crypto.getRandomValues(new Uint8Array(32))].map((b) => b.toString(16).padStart(2, '0')).join('')}` as const;
  return kept<`0x${string}`>('account', async () => random());
}
