/**
 * Structured logs: one JSON line per event on stderr ({time, level, peer, event, ...}).
 * Quiet by default (warnings and errors only); `--log-level info|debug` shows more.
 */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 99 };

export interface Logger {
  debug(event: string, fields?: Record<string, unknown>): void;
  info(event: string, fields?: Record<string, unknown>): void;
  warn(event: string, fields?: Record<string, unknown>): void;
  error(event: string, fields?: Record<string, unknown>): void;
}

/**
 * Lines of one event a logger writes a second (bursts of up to LOG_BURST): many come from what peers send (a malformed
 * message, a refused request), and a peer sending a million of them must not write a million lines. The next line of an
 * event after some were dropped says how many (`dropped`).
 */
export const LOG_LINES_PER_SECOND = 20;
export const LOG_BURST = 100;

export function createLogger(
  options: { level?: LogLevel; peer?: string; write?: (line: string) => void; now?: () => number } = {},
): Logger {
  const threshold = ORDER[options.level ?? 'warn'];
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const now = options.now ?? Date.now;
  const buckets = new Map<string, { tokens: number; at: number; dropped: number }>();
  const emit = (level: LogLevel) => (event: string, fields: Record<string, unknown> = {}) => {
    if (ORDER[level] < threshold) return;
    const t = now();
    const b = buckets.get(event) ?? { tokens: LOG_BURST, at: t, dropped: 0 };
    buckets.set(event, b);
    b.tokens = Math.min(LOG_BURST, b.tokens + ((t - b.at) / 1000) * LOG_LINES_PER_SECOND);
    b.at = t;
    if (b.tokens < 1) {
      b.dropped++;
      return;
    }
    b.tokens--;
    const dropped = b.dropped > 0 ? { dropped: b.dropped } : {};
    b.dropped = 0;
    write(`${JSON.stringify({ time: new Date(t).toISOString(), level, peer: options.peer, event, ...fields, ...dropped })}\n`);
  };
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') };
}

export function isLogLevel(v: unknown): v is LogLevel {
  return typeof v === 'string' && v in ORDER;
}
