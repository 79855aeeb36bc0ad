/**
 * How a peer is reached, from its addresses: pure functions (the dashboard's page uses them too).
 */

/** IPv4 ranges that are not on the internet (libp2p's private ranges, loopback and link-local): [first octets, prefix length]. */
const NOT_PUBLIC: [number[], number][] = [
  [[0], 8], [[10], 8], [[100, 64], 10], [[127], 8], [[169, 254], 16], [[172, 16], 12], [[192, 0, 2], 24], [[192, 168], 16],
  [[198, 18], 15], [[198, 51, 100], 24], [[203, 0, 113], 24],
];

/** Whether an IPv4 address is on the internet (none of NOT_PUBLIC). */
export function isPublicIPv4(ip: string): boolean {
  const o = ip.split('.').map(Number);
  if (o.length !== 4 || o.some((x) => !Number.isInteger(x) || x < 0 || x > 255)) return false;
  const n = ((o[0] << 24) | (o[1] << 16) | (o[2] << 8) | o[3]) >>> 0;
  return !NOT_PUBLIC.some(([net, len]) => {
    const base = ((net[0] << 24) | ((net[1] ?? 0) << 16) | ((net[2] ?? 0) << 8)) >>> 0;
    const mask = (~0 << (32 - len)) >>> 0;
    return ((n & mask) >>> 0) === ((base & mask) >>> 0);
  });
}

/** How a peer is reached (see `reach`). */
export type Reach = 'public' | 'webrtc' | 'relayed' | 'private';

/**
 * How a peer is reached, from the addresses it announced: 'public' (an address of its own on the internet), 'webrtc'
 * (behind NAT, reached directly over WebRTC signalled through a validator's relay, or through the relay where its NAT
 * lets nothing through), 'relayed' (only through a relay), or 'private' (loopback and LAN addresses: a swarm on one
 * machine or a LAN). Each link's path, as measured, is in its proximity entry.
 */
export function reach(addrs: readonly string[]): Reach {
  const own = addrs.filter((a) => !a.includes('/p2p-circuit'));
  if (own.some((a) => isPublicIPv4(/^\/ip4\/([\d.]+)\//.exec(a)?.[1] ?? ''))) return 'public';
  if (addrs.some((a) => a.includes('/p2p-circuit/webrtc'))) return 'webrtc';
  return addrs.some((a) => a.includes('/p2p-circuit')) ? 'relayed' : 'private';
}
