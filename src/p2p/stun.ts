import { createSocket, type Socket } from 'node:dgram';
import { isIPv4 } from 'node:net';

/**
 * A STUN server (RFC 8489, Binding only): it tells whoever asks the address and port its packet came from. A peer behind
 * NAT learns its router's public address and the port the router gave the flow, and offers them to the other side of a
 * WebRTC connection, which sends there to punch through (a port-preserving or endpoint-independent NAT lets the reply
 * in). Validators answer STUN on the UDP port of the same number as their TCP port, so a worker derives the server from
 * its bootstrap address (`stunServerOf`). No authentication, no TURN: a symmetric NAT falls back to the relay.
 */

const MAGIC = 0x2112a442;
const BINDING_REQUEST = 0x0001;
const BINDING_SUCCESS = 0x0101;
const XOR_MAPPED_ADDRESS = 0x0020;
const FINGERPRINT = 0x8028;
const FINGERPRINT_XOR = 0x5354554e;
const HEADER = 20;

/** The Binding success answer to `request` (a Binding request) from `address:port`; null for anything else. */
export function stunAnswer(request: Uint8Array, address: string, port: number): Uint8Array | null {
  if (request.length < HEADER || !isIPv4(address)) return null;
  const view = new DataView(request.buffer, request.byteOffset, request.byteLength);
  // the top two bits of a STUN message are 0; the length counts what follows the header, in 4-byte words
  if (view.getUint16(0) !== BINDING_REQUEST || view.getUint32(4) !== MAGIC || view.getUint16(2) + HEADER !== request.length) return null;
  const out = new Uint8Array(HEADER + 12 + 8);
  const o = new DataView(out.buffer);
  o.setUint16(0, BINDING_SUCCESS);
  o.setUint16(2, out.length - HEADER);
  o.setUint32(4, MAGIC);
  out.set(request.subarray(8, HEADER), 8); // the transaction id
  // XOR-MAPPED-ADDRESS: family IPv4, the port and address XORed with the magic cookie
  o.setUint16(20, XOR_MAPPED_ADDRESS);
  o.setUint16(22, 8);
  o.setUint16(24, 0x0001);
  o.setUint16(26, port ^ (MAGIC >>> 16));
  const ip = address.split('.').reduce((n, b) => ((n << 8) | Number(b)) >>> 0, 0);
  o.setUint32(28, (ip ^ MAGIC) >>> 0);
  // FINGERPRINT: CRC-32 of the message before it (its length already counted in the header), XORed
  o.setUint16(32, FINGERPRINT);
  o.setUint16(34, 4);
  o.setUint32(36, (crc32(out.subarray(0, 32)) ^ FINGERPRINT_XOR) >>> 0);
  return out;
}

/** The mapped address of a Binding success answer (a client's side: the tests read what the server saw). */
export function stunMappedAddress(answer: Uint8Array): { address: string; port: number } | null {
  if (answer.length < HEADER) return null;
  const v = new DataView(answer.buffer, answer.byteOffset, answer.byteLength);
  if (v.getUint16(0) !== BINDING_SUCCESS || v.getUint32(4) !== MAGIC) return null;
  for (let at = HEADER; at + 4 <= answer.length;) {
    const [type, len] = [v.getUint16(at), v.getUint16(at + 2)];
    if (type === XOR_MAPPED_ADDRESS && len >= 8 && v.getUint16(at + 4) === 1) {
      const ip = (v.getUint32(at + 8) ^ MAGIC) >>> 0;
      return { address: [24, 16, 8, 0].map((s) => (ip >>> s) & 255).join('.'), port: v.getUint16(at + 6) ^ (MAGIC >>> 16) };
    }
    at += 4 + Math.ceil(len / 4) * 4;
  }
  return null;
}

let table: Uint32Array | null = null;

function crc32(bytes: Uint8Array): number {
  if (!table) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let crc = 0xffffffff;
  for (const b of bytes) crc = table[(crc ^ b) & 255] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

/** A running STUN server. */
export interface StunServer {
  readonly port: number;
  close(): Promise<void>;
}

/**
 * Answers STUN Binding requests on UDP `port` of `host` (all interfaces by default). Anything else that arrives is
 * dropped unanswered: the server keeps serving. Rejects when the port cannot be bound.
 */
export function serveStun(port: number, host = '0.0.0.0'): Promise<StunServer> {
  const socket: Socket = createSocket({ type: 'udp4', reuseAddr: false });
  socket.on('message', (msg, from) => {
    const answer = stunAnswer(msg, from.address, from.port);
    if (answer) socket.send(answer, from.port, from.address);
  });
  return new Promise((resolve, reject) => {
    socket.once('error', reject);
    socket.bind(port, host, () => {
      socket.off('error', reject);
      // a send that fails (the asker is gone) must not stop the server
      socket.on('error', () => {});
      resolve({ port: socket.address().port, close: () => new Promise<void>((r) => socket.close(() => r())) });
    });
  });
}

/**
 * The STUN server of a validator at `bootstrap` (`/ip4/A/tcp/P/p2p/…` or `/dns4/H/tcp/P/…`): `stun:A:P`, the UDP port of
 * the same number as its TCP port; null for an address with no TCP port.
 */
export function stunServerOf(bootstrap: string): string | null {
  const m = /^\/(?:ip4|dns4|dns)\/([^/]+)\/tcp\/(\d+)(?:\/|$)/.exec(bootstrap);
  return m ? `stun:${m[1]}:${m[2]}` : null;
}
