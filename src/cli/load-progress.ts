import type { StageAssignment } from '../p2p/index.ts';
import type { LoadProgress } from '../user/index.ts';
import { bar, type Output } from './output.ts';

const mb = (bytes: number) => (bytes / 1e6).toFixed(0);

/**
 * Shows sections loading onto workers: one progress line for the whole job (bytes, MB/s,
 * each worker's share), and a line per worker when its section is in place (how much was sent
 * and how much it already held).
 */
export function loadProgress(out: Output): (stage: StageAssignment, progress: LoadProgress) => void {
  const started = performance.now();
  const stages = new Map<string, { stage: StageAssignment; progress: LoadProgress; since: number; reported: boolean }>();
  return (stage, progress) => {
    const key = `${stage.peerId}:${stage.replica}`;
    const entry = stages.get(key) ?? { stage, progress, since: performance.now(), reported: false };
    entry.progress = progress;
    stages.set(key, entry);
    const all = [...stages.values()];
    const done = all.reduce((s, e) => s + e.progress.done, 0);
    const total = all.reduce((s, e) => s + e.progress.total, 0);
    const seconds = (performance.now() - started) / 1000;
    const each = all.map((e) => `…${e.stage.peerId.slice(-6)} ${mb(e.progress.done)}/${mb(e.progress.total)}`).join(', ');
    out.progress(`loading ${bar(done / total)} ${mb(done)}/${mb(total)} MB, ${(done / 1e6 / Math.max(seconds, 1e-3)).toFixed(0)} MB/s  (${each})`);
    if (progress.done >= progress.total && !entry.reported) {
      entry.reported = true;
      const took = (performance.now() - entry.since) / 1000;
      const held = progress.total - progress.sent;
      out.info(
        `  loaded layers ${stage.start}–${stage.end - 1} on …${stage.peerId.slice(-6)}: ${mb(progress.total)} MB in ${took.toFixed(1)} s `
        + `(${(progress.total / 1e6 / Math.max(took, 1e-3)).toFixed(0)} MB/s; sent ${mb(progress.sent)} MB, the worker held ${mb(held)} MB)`,
      );
    }
  };
}
