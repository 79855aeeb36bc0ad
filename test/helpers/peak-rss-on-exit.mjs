// Preloaded into a CLI process (node --import) by tests that measure a whole command's memory: at exit it writes the
// process's peak resident set (VmHWM, in bytes) to stderr as `peak-rss N`.
import { readFileSync, writeSync } from 'node:fs';

process.on('exit', () => {
  const hwm = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync('/proc/self/status', 'utf8'));
  writeSync(2, `peak-rss ${hwm ? Number(hwm[1]) * 1024 : process.resourceUsage().maxRSS * 1024}\n`);
});
