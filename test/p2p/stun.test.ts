// The validators' STUN server (Binding only): the answer carries the asker's address and port as the server saw them,
// XORed as RFC 8489 says, with a fingerprint; anything that is not a Binding request is dropped and the server goes on.
// A real UDP round trip on 127.0.0.1, and the server a validator starts on its TCP port's number.
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { once } from 'node:events';
import { after, describe, test } from 'node:test';
import { serveStun, stunAnswer, stunMappedAddress, stunServerOf } from '../../src/p2p/index.ts';
import { startValidator, type Validator } from '../../src/validator/index.ts';

/** A Binding request with transaction id `id` (12 bytes). */
function bindingRequest(id: Uint8Array): Uint8Array {
  const m = new Uint8Array(20);
  const v = new DataView(m.buffer);
  v.setUint16(0, 0x0001);
  v.setUint16(2, 0);
  v.setUint32(4, 0x2112a442);
  m.set(id, 8);
  return m;
}

/** Sends `message` to 127.0.0.1:`port` from a fresh socket; its port and the answer (null: none within 500 ms). */
async function ask(port: number, message: Uint8Array): Promise<{ from: number; answer: Uint8Array | null }> {
  const socket = createSocket('udp4');
  socket.bind(0, '127.0.0.1');
  await once(socket, 'listening');
  try {
    const answer = new Promise<Uint8Array | null>((resolve) => {
      socket.once('message', (msg) => resolve(new Uint8Array(msg)));
      setTimeout(() => resolve(null), 500);
    });
    socket.send(message, port, '127.0.0.1');
    return { from: socket.address().port, answer: await answer };
  } finally {
    socket.close();
  }
}

describe('STUN', () => {
  test('an answer maps the asker\'s address and port, keeps the transaction id and ends in a valid fingerprint', () => {
    const id = Uint8Array.from({ length: 12 }, (_, i) => i * 17);
    const answer = stunAnswer(bindingRequest(id), '11.20.9.3', 40_123)!;
    assert.deepEqual(stunMappedAddress(answer), { address: '11.20.9.3', port: 40_123 });
    assert.deepEqual(answer.subarray(8, 20), id);
    const v = new DataView(answer.buffer);
    assert.equal(v.getUint16(2), answer.length - 20, 'length: what follows the header');
    assert.equal(v.getUint16(answer.length - 8), 0x8028, 'FINGERPRINT last');
    // the fingerprint of an answer with one bit changed no longer matches: the same function over the changed bytes differs
    const other = stunAnswer(bindingRequest(id), '11.20.9.3', 40_124)!;
    assert.notEqual(new DataView(other.buffer).getUint32(other.length - 4), v.getUint32(answer.length - 4));
  });

  test('what is not a Binding request gets no answer', () => {
    const good = bindingRequest(new Uint8Array(12));
    assert.equal(stunAnswer(good.subarray(0, 19), '1.2.3.4', 1), null, 'short');
    const wrongCookie = good.slice();
    wrongCookie[4] ^= 1;
    assert.equal(stunAnswer(wrongCookie, '1.2.3.4', 1), null, 'no magic cookie');
    const wrongLength = good.slice();
    wrongLength[3] = 4;
    assert.equal(stunAnswer(wrongLength, '1.2.3.4', 1), null, 'length past the datagram');
    const response = good.slice();
    response[1] = 0x01;
    response[0] = 0x01;
    assert.equal(stunAnswer(response, '1.2.3.4', 1), null, 'an answer, not a request');
    assert.equal(stunAnswer(good, '::1', 1), null, 'IPv6: not served');
  });

  test('over UDP: garbage is dropped and the next request answered', async () => {
    const server = await serveStun(0, '127.0.0.1');
    try {
      assert.equal((await ask(server.port, new TextEncoder().encode('hello'))).answer, null);
      const { from, answer } = await ask(server.port, bindingRequest(new Uint8Array(12).fill(7)));
      assert.deepEqual(stunMappedAddress(answer!), { address: '127.0.0.1', port: from });
    } finally {
      await server.close();
    }
  });

  describe('a validator', () => {
    let validator: Validator;
    after(() => validator?.stop());
    test('answers STUN on the UDP port of its TCP port\'s number, which its address names', async () => {
      validator = await startValidator({ listen: ['/ip4/127.0.0.1/tcp/0'] });
      const addr = validator.node.getMultiaddrs()[0].toString();
      const url = stunServerOf(addr)!;
      const [, host, port] = url.split(':');
      assert.equal(host, '127.0.0.1');
      const { from, answer } = await ask(Number(port), bindingRequest(new Uint8Array(12).fill(1)));
      assert.deepEqual(stunMappedAddress(answer!), { address: '127.0.0.1', port: from });
      assert.equal(stunServerOf('/dns4/boot.example/tcp/4001/p2p/12D3KooW'), 'stun:boot.example:4001');
      assert.equal(stunServerOf('/ip4/1.2.3.4/udp/4001/quic-v1'), null);
    });
  });
});
