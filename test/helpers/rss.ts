import { readFileSync } from 'node:fs';

/**
 * The peak resident set of this process since it started. On Linux that is VmHWM: getrusage's
 * maxRSS (process.resourceUsage().maxRSS) carries the parent's peak across fork and exec, so
 * a child of a process that built a large model reports at least that much whatever it did.
 */
export function peakRss(): number {
  try {
    const hwm = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
    if (hwm) return Number(hwm[1]) * 1024;
  } catch {
    // not Linux: maxRSS, which may include the parent's peak
  }
  return process.resourceUsage().maxRSS * 1024;
}
