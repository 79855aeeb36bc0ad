import { createServer, type Socket, connect } from 'node:net';
import type { Stream } from '@libp2p/interface';
import { createNode, encodeControl, receiveFrames, sendParts } from '../src/p2p/index.ts';
import type { Row } from './gemm.ts';

const PROTOCOL = '/tensorlink/bench/1.0.0';
const TOTAL = 256 * 1024 * 1024;
const CHUNK = 1024 * 1024;

async function rawTcp(): Promise<{ mbps: number; rttMs: number }> {
  let received = 0;
  let done: () => void = () => {};
  let mode: 'bulk' | 'echo' = 'bulk';
  const server = createServer((s: Socket) => {
    s.on('data', (d) => {
      if (mode === 'echo') s.write(d);
      else {
        received += d.length;
        if (received >= TOTAL) done();
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  const client = connect(port, '127.0.0.1');
  await new Promise<void>((r) => client.once('connect', () => r()));
  client.setNoDelay(true);
  const chunk = new Uint8Array(CHUNK);
  const finished = new Promise<void>((r) => {
    done = r;
  });
  const t0 = performance.now();
  for (let sent = 0; sent < TOTAL; sent += CHUNK) {
    if (!client.write(chunk)) await new Promise<void>((r) => client.once('drain', () => r()));
  }
  await finished;
  const mbps = TOTAL / 2 ** 20 / ((performance.now() - t0) / 1000);
  mode = 'echo';
  const times: number[] = [];
  for (let i = 0; i < 1000; i++) {
    const t = performance.now();
    const back = new Promise<void>((r) => client.once('data', () => r()));
    client.write(new Uint8Array(32));
    await back;
    times.push(performance.now() - t);
  }
  client.destroy();
  server.close();
  times.sort((a, b) => a - b);
  return { mbps, rttMs: times[500] };
}

async function overLibp2p(): Promise<{ mbps: number; rttMs: number }> {
  const server = await createNode();
  const client = await createNode();
  let received = 0;
  let done: () => void = () => {};
  await server.handle(PROTOCOL, (stream: Stream) => {
    stream.addEventListener('message', (evt) => {
      received += evt.data.byteLength;
      if (received >= TOTAL) done();
    });
  });
  await server.handle(`${PROTOCOL}/echo`, (stream: Stream) => {
    receiveFrames(stream, (frame) => {
      if (frame.kind === 'control') stream.send(encodeControl(frame.message));
    });
  });
  const addr = server.getMultiaddrs()[0];
  const bulk = await client.dialProtocol(addr, PROTOCOL);
  const finished = new Promise<void>((r) => {
    done = r;
  });
  const t0 = performance.now();
  await sendParts(bulk, [new Uint8Array(TOTAL)]);
  await finished;
  const mbps = TOTAL / 2 ** 20 / ((performance.now() - t0) / 1000);
  const echo = await client.dialProtocol(addr, `${PROTOCOL}/echo`);
  let resolveReply: () => void = () => {};
  receiveFrames(echo, () => resolveReply());
  const times: number[] = [];
  for (let i = 0; i < 1000; i++) {
    const t = performance.now();
    const back = new Promise<void>((r) => {
      resolveReply = r;
    });
    echo.send(encodeControl({ i }));
    await back;
    times.push(performance.now() - t);
  }
  await client.stop();
  await server.stop();
  times.sort((a, b) => a - b);
  return { mbps, rttMs: times[500] };
}

/** Tensor-sized bulk throughput and small-request round trips: libp2p (noise + yamux) against raw TCP. */
export async function benchP2p(): Promise<Row[]> {
  const raw = await rawTcp();
  const p2p = await overLibp2p();
  return [
    {
      section: 'p2p',
      case: '256 MiB one way on loopback, libp2p (tcp+noise+yamux) vs raw TCP',
      value: p2p.mbps,
      unit: 'MiB/s',
      reference: 'raw TCP',
      referenceValue: raw.mbps,
      ratio: p2p.mbps / raw.mbps,
      target: '≥ 0.3',
    },
    {
      section: 'p2p',
      case: 'round trip of a small request on an open stream',
      value: p2p.rttMs,
      unit: 'ms',
      reference: 'raw TCP',
      referenceValue: raw.rttMs,
      ratio: p2p.rttMs / raw.rttMs,
      target: '≤ 0.3 ms',
    },
  ];
}
