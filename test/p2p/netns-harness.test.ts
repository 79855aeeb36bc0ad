import assert from 'node:assert/strict';
import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { connect, createServer, type Server } from 'node:net';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { type DelayRelay, startDelayRelay } from '../helpers/delay-relay.ts';
import { type Host, hostMesh, type Mesh } from '../helpers/netns.ts';

const run = promisify(execFile);

/** A sink: counts the bytes of each connection and, at its end, answers {"bytes":N}. Argument: the address to listen on. */
const SINK = `
const net = require('node:net');
const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (s) => {
  let bytes = 0;
  s.on('data', (c) => { bytes += c.length; });
  s.on('end', () => s.end(JSON.stringify({ bytes })));
  s.on('error', () => {});
});
server.listen(0, process.argv[1], () => console.log(JSON.stringify({ port: server.address().port })));
`;

/** A sender: sends N bytes to HOST:PORT, waits for the sink's answer, prints {"bytes":N,"ms":T} (T from connect to answer). */
const SEND = `
const net = require('node:net');
const [host, port, n] = process.argv.slice(1);
const payload = Buffer.alloc(Number(n), 7);
const s = net.connect({ host, port: Number(port), allowHalfOpen: true, noDelay: true });
let t0 = 0;
let reply = '';
s.on('connect', () => { t0 = performance.now(); s.end(payload); });
s.on('data', (c) => { reply += c; });
s.on('end', () => console.log(JSON.stringify({ ...JSON.parse(reply), ms: performance.now() - t0 })));
s.on('error', (e) => { console.error(e.message); process.exit(1); });
`;

const MB = 1024 * 1024;

/** The command line that runs `node -e script args` on a host, or here in the root namespace (null). */
function nodeOn(host: Host | null, script: string, args: string[]): string[] {
  return [...(host?.exec ?? []), process.execPath, '-e', script, ...args];
}

/** Starts a program and waits for its first stdout line, parsed as JSON. */
async function startReady<T>(argv: string[], children: ChildProcess[]): Promise<T> {
  const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  const lines = createInterface({ input: child.stdout! });
  const timeout = setTimeout(() => child.kill('SIGKILL'), 15_000);
  try {
    const [line] = (await Promise.race([
      once(lines, 'line'),
      once(child, 'exit').then(([code]) => {
        throw new Error(`${argv.slice(0, 6).join(' ')} … exited (${code}) before it was ready`);
      }),
    ])) as [string];
    return JSON.parse(line) as T;
  } finally {
    clearTimeout(timeout);
  }
}

/** Sends `bytes` from a host (null: a child process in the root namespace) to a sink; returns the goodput in Mbit/s. */
async function send(from: Host | null, ip: string, port: number, bytes: number): Promise<{ bytes: number; ms: number; mbit: number }> {
  const argv = nodeOn(from, SEND, [ip, `${port}`, `${bytes}`]);
  const { stdout } = await run(argv[0], argv.slice(1), { timeout: 15_000 });
  const r = JSON.parse(stdout) as { bytes: number; ms: number };
  return { ...r, mbit: (r.bytes * 8) / (r.ms * 1000) };
}

/** Connects from this process, writes `payload`, ends, and collects the whole answer. */
async function exchange(host: string, port: number, payload: Buffer): Promise<{ reply: Buffer; ms: number }> {
  const s = connect({ host, port, allowHalfOpen: true, noDelay: true });
  await once(s, 'connect');
  const t0 = performance.now();
  const chunks: Buffer[] = [];
  s.on('data', (c: Buffer) => chunks.push(c));
  s.end(payload);
  await once(s, 'end');
  const ms = performance.now() - t0;
  s.destroy();
  return { reply: Buffer.concat(chunks), ms };
}

/** An echo server in this process, on 127.0.0.1. */
async function echoServer(): Promise<{ server: Server; port: number }> {
  const server = createServer({ allowHalfOpen: true, noDelay: true }, (s) => {
    s.pipe(s);
    s.on('error', () => {});
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { server, port: (server.address() as { port: number }).port };
}

function leftovers(): string[] {
  const tag = `${process.pid}`;
  const ns = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').filter((l) => l.includes(`-${tag}-`));
  const links = execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' }).split('\n').filter((l) => l.includes(`tl${tag}r`));
  return [...ns, ...links];
}

describe('hostMesh: hosts on one switch, made of network namespaces, with per-pair bandwidth limits', () => {
  let mesh: Mesh;
  const children: ChildProcess[] = [];
  const relays: DelayRelay[] = [];
  const servers: Server[] = [];
  /** The port of the sink on each host, and (last) on the root namespace's address. */
  const sinks: number[] = [];

  before(async () => {
    mesh = hostMesh(3);
    for (const h of mesh.hosts) sinks.push((await startReady<{ port: number }>(nodeOn(h, SINK, [h.ip]), children)).port);
    sinks.push((await startReady<{ port: number }>(nodeOn(null, SINK, [mesh.rootIp]), children)).port);
  });

  after(async () => {
    for (const c of children) c.kill('SIGKILL');
    await Promise.all(relays.map((r) => r.close()));
    for (const s of servers) s.close();
    mesh?.remove();
  });

  test('bad arguments are InvalidArgumentError, and a machine without ip is NetnsUnavailableError', () => {
    assert.throws(() => hostMesh(0), { name: 'InvalidArgumentError' });
    assert.throws(() => hostMesh(2, { subnet: '8.8.8' }), { name: 'InvalidArgumentError' });
    assert.throws(() => hostMesh(2, { subnet: '10.78' }), { name: 'InvalidArgumentError' });
    assert.throws(() => mesh.shape(0, 3, 10), { name: 'InvalidArgumentError' });
    assert.throws(() => mesh.shape(0, 0, 10), { name: 'InvalidArgumentError' });
    assert.throws(() => mesh.shape(0, 1, 0), { name: 'InvalidArgumentError' });
    const path = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      assert.throws(() => hostMesh(1), (err: Error) => err.name === 'NetnsUnavailableError' && /not installed/.test(err.message));
    } finally {
      process.env.PATH = path;
    }
  });

  test('host 0 reaches host 1, the test process reaches every host, and a host reaches the test process at rootIp', async () => {
    const [h0, h1] = mesh.hosts;
    assert.equal((await send(h0, h1.ip, sinks[1], 5)).bytes, 5);
    for (const [i, h] of mesh.hosts.entries()) {
      const { reply } = await exchange(h.ip, sinks[i], Buffer.from('hello'));
      assert.deepEqual(JSON.parse(reply.toString()), { bytes: 5 }, `host ${i}`);
    }
    assert.equal((await send(h0, mesh.rootIp, sinks[3], 5)).bytes, 5);
    // each host has its own loopback: host 0's 127.0.0.1 does not lead to host 1's sink
    await assert.rejects(send(h0, '127.0.0.1', sinks[1], 5));
  });

  test('shape(0, 1, 10): host 0 <-> host 1 runs at about 10 Mbit/s both ways while host 0 -> host 2 stays fast; null lifts it; -1 shapes the root namespace', async (t) => {
    const [h0, h1, h2] = mesh.hosts;
    mesh.shape(0, 1, 10);
    const [shaped, other] = await Promise.all([send(h0, h1.ip, sinks[1], 2 * MB), send(h0, h2.ip, sinks[2], 16 * MB)]);
    const back = await send(h1, h0.ip, sinks[0], 1 * MB);
    t.diagnostic(`0->1 ${shaped.mbit.toFixed(1)} Mbit/s, 1->0 ${back.mbit.toFixed(1)} Mbit/s, 0->2 meanwhile ${other.mbit.toFixed(0)} Mbit/s`);
    assert.ok(shaped.mbit > 6 && shaped.mbit < 12, `0->1 at ${shaped.mbit} Mbit/s`);
    assert.ok(back.mbit > 6 && back.mbit < 12, `1->0 at ${back.mbit} Mbit/s`);
    assert.ok(other.mbit > 50, `0->2 at ${other.mbit} Mbit/s`);

    mesh.shape(0, 1, null);
    const lifted = await send(h0, h1.ip, sinks[1], 16 * MB);
    mesh.shape(-1, 2, 20);
    const fromRoot = await send(null, h2.ip, sinks[2], 2 * MB);
    const rootToOther = await send(null, h1.ip, sinks[1], 16 * MB);
    mesh.shape(-1, 2, null);
    t.diagnostic(`0->1 unshaped ${lifted.mbit.toFixed(0)} Mbit/s, root->2 at 20: ${fromRoot.mbit.toFixed(1)} Mbit/s, root->1 ${rootToOther.mbit.toFixed(0)} Mbit/s`);
    assert.ok(lifted.mbit > 50, `0->1 after shape(0, 1, null) at ${lifted.mbit} Mbit/s`);
    assert.ok(fromRoot.mbit > 12 && fromRoot.mbit < 24, `root->2 at ${fromRoot.mbit} Mbit/s`);
    assert.ok(rootToOther.mbit > 50, `root->1 at ${rootToOther.mbit} Mbit/s`);
  });

  test('a delay relay of 50 ms makes a round trip take 100 to 250 ms, keeps bytes in order, and does not serialize its delays', async (t) => {
    const echo = await echoServer();
    servers.push(echo.server);
    const relay = await startDelayRelay({ targetHost: '127.0.0.1', targetPort: echo.port, delayMs: 50 });
    relays.push(relay);
    const rtt = await exchange('127.0.0.1', relay.port, Buffer.from('ping'));
    assert.equal(rtt.reply.toString(), 'ping');
    // 4 MiB in ~64 KiB chunks: through a relay that held one chunk at a time this would take 64 × 100 ms
    const bulk = Buffer.from(Array.from({ length: 4 * MB }, (_, i) => i % 251));
    const big = await exchange('127.0.0.1', relay.port, bulk);
    t.diagnostic(`round trip ${rtt.ms.toFixed(1)} ms; 4 MiB there and back in ${big.ms.toFixed(0)} ms`);
    // the delay is a floor the relay guarantees; how much a loaded machine adds on top is no test
    assert.ok(rtt.ms >= 100, `round trip ${rtt.ms} ms`);
    assert.ok(big.reply.equals(bulk), 'the echo came back whole and in order');
    assert.ok(big.ms >= 100, `4 MiB round trip ${big.ms} ms`);
  });

  test('the delay relay runs as its own process inside a host: {"event":"ready"} and 2 × 50 ms on the way to another host', async (t) => {
    const [h0, h1] = mesh.hosts;
    const argv = [...h0.exec, process.execPath, '--import', 'tsx', 'test/helpers/delay-relay.ts',
      '--listen', `${h0.ip}:0`, '--target', `${h1.ip}:${sinks[1]}`, '--delay', '50'];
    const ready = await startReady<{ event: string; port: number }>(argv, children);
    assert.equal(ready.event, 'ready');
    const { reply, ms } = await exchange(h0.ip, ready.port, Buffer.from('hello'));
    t.diagnostic(`root -> relay on host 0 -> sink on host 1 and back: ${ms.toFixed(1)} ms`);
    assert.deepEqual(JSON.parse(reply.toString()), { bytes: 5 });
    assert.ok(ms >= 100, `round trip ${ms} ms`);
  });

  test('remove() leaves no namespace or interface with this pid, kills what ran inside, and may be called again', async () => {
    const inside = children[0];
    assert.ok(leftovers().length > 0, 'the mesh is there before');
    mesh.remove();
    mesh.remove();
    assert.deepEqual(leftovers(), []);
    if (inside.exitCode === null && inside.signalCode === null) await once(inside, 'exit');
    assert.equal(inside.signalCode, 'SIGKILL');
    assert.throws(() => mesh.shape(0, 1, 10), { name: 'InvalidArgumentError' });
  });
});
