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
