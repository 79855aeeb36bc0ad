/**
 * The gossip flooder of the fuzz bench, in its own process as an attacker would be (its send queues are its own):
 *   node --import tsx bench/fuzz-gossip-child.ts JSON
 * where JSON is a `GossipJob`. Dials the validator, then publishes `count` announcements on the peers' topic, signed as
 * every gossip message is: two in ten well-formed, one in ten random bytes, the rest a well-formed one mutated. Writes
 * one line of JSON (`GossipResult`) to stdout.
 */
import '../src/polyfills.ts';
import { peerIdFromString } from '@libp2p/peer-id';
import { multiaddr } from '@multiformats/multiaddr';
import { createNode, PEERS_TOPIC } from '../src/p2p/index.ts';
import { Generator } from '../src/tensor/index.ts';
import { mutateValue } from './fuzz-frames.ts';

export interface GossipJob {
  validator: string;
  count: number;
  seed: number;
}

export interface GossipResult {
  published: number;
  seconds: number;
  /** Times it dialled again, hung up on. */
  redials: number;
}

const job = JSON.parse(process.argv[2]) as GossipJob;
const node = await createNode();
const target = multiaddr(job.validator);
const validator = peerIdFromString(job.validator.split('/p2p/')[1]);
let redials = 0;
await node.dial(target);
// the validator's subscription reaches this node shortly after the connection
for (let i = 0; i < 100 && node.services.pubsub.getSubscribers(PEERS_TOPIC).length === 0; i++) await new Promise((r) => setTimeout(r, 50));
const rng = new Generator(job.seed);
const announce = { type: 'announce', roles: ['worker'], addrs: ['/ip4/127.0.0.1/tcp/1'], proximity: {}, capabilities: null };
const started = performance.now();
let published = 0;
for (let i = 0; i < job.count; i++) {
  const m = rng.int(10) < 2 ? { ...announce, at: Date.now() } : mutateValue({ ...announce, at: Date.now() }, rng);
  const junk = rng.int(10) === 0;
  const bytes = junk ? Uint8Array.from({ length: 1 + rng.int(64) }, () => rng.int(256)) : new TextEncoder().encode(JSON.stringify(m));
  // publishing queues without limit: every few hundred, a turn of the event loop lets the connection drain; hung up
  // on, it dials again (as an attacker would)
  if (i % 256 === 0) {
    await new Promise((r) => setImmediate(r));
    if (node.getConnections(validator).length === 0) {
      redials++;
      await node.dial(target).catch(() => {});
    }
  }
  if (await node.services.pubsub.publish(PEERS_TOPIC, bytes).then(() => true, () => false)) published++;
}
const seconds = (performance.now() - started) / 1000;
await node.stop();
process.stdout.write(`${JSON.stringify({ published, seconds, redials } satisfies GossipResult)}\n`);
process.exit(0);
