import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { createNode, encodeControl, encodeTensor, type Frame, receiveFrames, sendParts } from '../../src/p2p/index.ts';

const PROTOCOL = '/tensorlink/test-echo/1.0.0';

describe('libp2p transport on 127.0.0.1', () => {
  test('a node keeps its peer id across restarts', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tl-id-'));
    const a = await createNode({ dataDir: dir });
    const id = a.peerId.toString();
    await a.stop();
    const b = await createNode({ dataDir: dir });
    assert.equal(b.peerId.toString(), id);
    await b.stop();
  });

  test('a 64 MiB tensor arrives bit for bit; a malformed frame resets only its stream', async () => {
    const server = await createNode();
    const client = await createNode();
    try {
      await server.handle(PROTOCOL, (stream) => {
        receiveFrames(
          stream,
          (frame) => {
            if (frame.kind === 'tensor') void sendParts(stream, encodeTensor(frame.tensor));
            else stream.send(encodeControl({ echo: frame.message }));
          },
          () => {},
        );
      });
      const size = 64 * 1024 * 1024;
      const bytes = new Uint8Array(size);
      for (let i = 0; i < size; i += 4096) bytes[i] = (i * 2654435761) >>> 24;
      bytes[size - 1] = 99;
      const stream = await client.dialProtocol(server.getMultiaddrs()[0], PROTOCOL, { signal: AbortSignal.timeout(10_000) });
      const got = new Promise<Frame>((resolve) => receiveFrames(stream, resolve));
      await sendParts(stream, encodeTensor({ requestId: 5, dtype: 'float32', shape: [size / 4], bytes }));
      const frame = await got;
      assert.equal(frame.kind, 'tensor');
      if (frame.kind === 'tensor') {
        assert.equal(frame.tensor.requestId, 5);
        assert.equal(Buffer.compare(Buffer.from(frame.tensor.bytes), Buffer.from(bytes)), 0);
      }
      // garbage on a second stream: that stream is reset, the server still answers on a new one
      const bad = await client.dialProtocol(server.getMultiaddrs()[0], PROTOCOL);
      const closed = new Promise<void>((resolve) => bad.addEventListener('close', () => resolve()));
      bad.send(Uint8Array.from([255, 255, 255, 255, 9, 9, 9]));
      await closed;
      const again = await client.dialProtocol(server.getMultiaddrs()[0], PROTOCOL);
      const reply = new Promise<Frame>((resolve) => receiveFrames(again, resolve));
      again.send(encodeControl({ type: 'ping' }));
      assert.deepEqual(await reply, { kind: 'control', message: { echo: { type: 'ping' } } });
    } finally {
      await client.stop();
      await server.stop();
    }
  });
});
