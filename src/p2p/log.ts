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

export function createLogger(options: { level?: LogLevel; peer?: string; write?: (line: string) => void } = {}): Logger {
  const threshold = ORDER[options.level ?? 'warn'];
  const write = options.write ?? ((line: string) => process.stderr.write(line));
  const emit = (level: LogLevel) => (event: string, fields: Record<string, unknown> = {}) => {
    if (ORDER[level] < threshold) return;
    write(`${JSON.stringify({ time: new Date().toISOString(), level, peer: options.peer, event, ...fields })}\n`);
  };
  return { debug: emit('debug'), info: emit('info'), warn: emit('warn'), error: emit('error') };
}

export function isLogLevel(v: unknown): v is LogLevel {
  return typeof v === 'string' && v in ORDER;
}
