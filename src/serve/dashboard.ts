import type { Deployment } from '../chain/index.ts';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import Fastify, { type FastifyInstance } from 'fastify';
import type { Overview } from '../user/index.ts';
import { type DashboardState, metricsText, type ServingStats } from './metrics.ts';

/** How often the page is sent the state (server-sent events): live enough to watch a step, cheap for the validator. */
export const DASHBOARD_PUSH_MS = 1_000;
/** The state is asked of the validator at most this often, however many pages and scrapes are open. */
const STATE_CACHE_MS = 500;
/** Where `npm run build:dashboard` (run by `npm ci` and `npm run build`) writes the page: dist/dashboard/ at the package's root. */
export const DASHBOARD_DIR = fileURLToPath(new URL('../../dist/dashboard/', import.meta.url));
/** The /lend page (src/browser/, bundled beside the dashboard): the swarm as a browser tab sees it over its own libp2p. */
export const LEND_DIR = fileURLToPath(new URL('../../dist/lend/', import.meta.url));
const ASSETS: Record<string, string> = {
  'index.html': 'text/html; charset=utf-8',
  'app.js': 'text/javascript; charset=utf-8',
  'engine.js': 'text/javascript; charset=utf-8',
  'serve.js': 'text/javascript; charset=utf-8',
  'app.css': 'text/css; charset=utf-8',
  // onnxruntime-web's WebGPU runtime, for a tab on its GPU (src/browser/gpu.ts)
  'ort/ort-wasm-simd-threaded.asyncify.mjs': 'text/javascript; charset=utf-8',
  'ort/ort-wasm-simd-threaded.asyncify.wasm': 'application/wasm',
};

/** Where the dashboard's figures come from: the swarm's validator (absent: no swarm), and what this process serves (absent: nothing). */
export interface DashboardSource {
  overview?: () => Promise<Overview>;
  serving?: () => ServingStats;
  /** The validator's peer id and addresses, for the /lend page's libp2p to dial (absent: no /lend). */
  validator?: () => { peerId: string; addrs: string[]; chain?: Deployment };
}

/**
 * The dashboard on a Fastify app: the page (`/`, bundled at build time from web/dashboard/,
 * nothing fetched at run time), its state (`/api/state`), the state pushed every second as
 * server-sent events (`/api/stream`), and the same figures for Prometheus (`/metrics`).
 */
export function dashboardRoutes(app: FastifyInstance, source: DashboardSource): void {
  let cached: { at: number; state: Promise<DashboardState>; settled: boolean } | null = null;
  const state = (): Promise<DashboardState> => {
    const now = Date.now();
    // one question to the validator at a time, and none more often than STATE_CACHE_MS
    if (cached && (!cached.settled || now - cached.at < STATE_CACHE_MS)) return cached.state;
    const serving = source.serving?.() ?? null;
    const read = source.overview
      ? source.overview().then(
          (overview) => ({ at: now, overview, serving }),
          (err: unknown) => ({ at: now, overview: null, serving, error: `the validator did not answer: ${(err as Error).message}` }),
        )
      : Promise.resolve({ at: now, overview: null, serving });
    const entry = { at: now, state: read, settled: false };
    void read.then(() => (entry.settled = true));
    cached = entry;
    return read;
  };
  const asset = (name: string, dir = DASHBOARD_DIR) => async (_req: unknown, reply: import('fastify').FastifyReply) => {
    const path = `${dir}${name}`;
    if (!existsSync(path)) {
      return reply.code(503).type('text/plain; charset=utf-8')
        .send(`the dashboard is not built (${path} is missing): run npm run build:dashboard in the project, or npm ci\n`);
    }
    return reply.type(ASSETS[name]).header('cache-control', 'no-cache').send(readFileSync(path));
  };
  app.get('/', asset('index.html'));
  app.get('/dashboard', asset('index.html'));
  app.get('/assets/app.js', asset('app.js'));
  app.get('/assets/app.css', asset('app.css'));
  app.get('/api/state', () => state());
  if (source.validator) {
    const validator = source.validator;
    app.get('/lend', asset('index.html', LEND_DIR));
    app.get('/lend/app.js', asset('app.js', LEND_DIR));
    app.get('/lend/engine.js', asset('engine.js', LEND_DIR));
    app.get('/lend/serve.js', asset('serve.js', LEND_DIR));
    for (const f of ['ort/ort-wasm-simd-threaded.asyncify.mjs', 'ort/ort-wasm-simd-threaded.asyncify.wasm']) app.get(`/lend/${f}`, asset(f, LEND_DIR));
    // where the page's libp2p dials: this validator, at every address it listens on (the page picks what a tab can open)
    app.get('/lend/validator.json', () => validator());
  }
  app.get('/metrics', async (_req, reply) => reply.type('text/plain; version=0.0.4; charset=utf-8').send(metricsText(await state())));
  app.get('/api/stream', (req, reply) => {
    reply.hijack();
    reply.raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'connection': 'keep-alive' });
    let open = true;
    const push = async () => {
      const s = await state();
      // a page that does not read (a stalled connection) is sent nothing more until it drains
      if (open && !reply.raw.writableNeedDrain) reply.raw.write(`data: ${JSON.stringify(s)}\n\n`);
    };
    const timer = setInterval(() => void push(), DASHBOARD_PUSH_MS);
    void push();
    req.raw.on('close', () => {
      open = false;
      clearInterval(timer);
    });
  });
}

export interface DashboardServer {
  url: string;
  close(): Promise<void>;
}

/**
 * The dashboard alone on its own port (a validator's, a swarm's); with `fallback`, a port already
 * taken (another swarm on this machine) gives way to any free one.
 */
export async function serveDashboard(
  source: DashboardSource, options: { host?: string; port?: number; fallback?: boolean } = {},
): Promise<DashboardServer> {
  const host = options.host ?? '127.0.0.1';
  const listen = async (port: number) => {
    const app = Fastify({ logger: false, forceCloseConnections: true });
    dashboardRoutes(app, source);
    try {
      return { url: await app.listen({ host, port }), close: () => app.close() };
    } catch (err) {
      await app.close();
      throw err;
    }
  };
  try {
    return await listen(options.port ?? 0);
  } catch (err) {
    if (!options.fallback || (err as { code?: string }).code !== 'EADDRINUSE') throw err;
    return listen(0);
  }
}
