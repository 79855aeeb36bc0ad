import type { FailoverEvent } from '../user/index.ts';

/**
 * What a command prints: results on stdout (one JSON object with --json), human
 * progress on stderr, so `tensorlink ... --json | jq` always works.
 */
export interface Output {
  json: boolean;
  /** Human progress and tables (stderr). */
  info(line: string): void;
  /** A progress line rewritten in place on a terminal. */
  progress(line: string): void;
  /** The command's result: JSON on stdout with --json, else the human summary. */
  result(value: unknown, human: string): void;
}

export function createOutput(json: boolean): Output {
  const tty = process.stderr.isTTY === true;
  let open = false;
  const endProgress = () => {
    if (open) process.stderr.write('\n');
    open = false;
  };
  return {
    json,
    info(line) {
      endProgress();
      process.stderr.write(`${line}\n`);
    },
    progress(line) {
      if (tty) {
        process.stderr.write(`\r\x1b[2K${line}`);
        open = true;
      }
    },
    result(value, human) {
      endProgress();
      if (json) process.stdout.write(`${JSON.stringify(value)}\n`);
      else process.stdout.write(`${human}\n`);
    },
  };
}

export function bar(fraction: number, width = 24): string {
  const filled = Math.round(Math.max(0, Math.min(1, fraction)) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

/** One line about a worker lost in a job and how the job went on. */
export function failoverLine(e: FailoverEvent): string {
  const how = e.action === 'spare' ? `moved to …${e.replacement[0]?.slice(-6)}` : `planned again on ${e.replacement.map((p) => `…${p.slice(-6)}`).join(', ') || 'the live workers'}`;
  const took = e.recoveredMs === undefined ? '' : `, back in ${(e.recoveredMs / 1000).toFixed(1)} s`;
  return `worker …${e.peer.slice(-6)} was lost (${e.cause}): layers ${e.layers[0]}-${e.layers[1] - 1} ${how}, ${e.replayed} ${e.during === 'training' ? 'steps' : 'decoding steps'} replayed${took}`;
}
