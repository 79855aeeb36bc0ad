import { writeFileSync } from 'node:fs';
import { reportSvg, simulateSwarm, type SimulationReport } from '../../sim/index.ts';
import { type Flags, intFlag, numberFlag, stringFlag } from '../args.ts';
import { bar, type Output } from '../output.ts';

/**
 * `tensorlink simulate --peers N --hours H` (`npm run simulate`): the swarm's own registry, router, planner,
 * placement, sampling, reputation, ledger and pay over N simulated peers in H hours of virtual time (src/sim/). With
 * --json, the report as one object.
 */
export async function simulateCommand(flags: Flags, out: Output): Promise<void> {
  const peers = intFlag(flags, 'peers', 10_000);
  const hours = numberFlag(flags, 'hours', 1);
  const report = simulateSwarm({
    peers, hours, seed: intFlag(flags, 'seed', 1, 0),
    medianLifetimeHours: numberFlag(flags, 'lifetime', 1),
    cheaterShare: numberFlag(flags, 'cheaters', 0.02),
    onProgress: (virtualMs, wallMs) =>
      out.progress(`${bar(virtualMs / (hours * 3_600_000))} ${(virtualMs / 60_000).toFixed(0)} of ${hours * 60} virtual minutes, ${(wallMs / 1000).toFixed(1)} s`),
  });
  const svg = stringFlag(flags, 'svg');
  if (svg) writeFileSync(svg, reportSvg(report));
  out.result(report, summary(report));
}

function summary(r: SimulationReport): string {
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const failed = Object.entries(r.sessionsFailed).map(([k, v]) => `${v} ${k}`).join(', ') || 'none';
  return [
    `${r.peers} peers, ${r.virtualHours} virtual hours in ${r.wallSeconds.toFixed(1)} s (${r.events} events)`,
    `sessions: ${r.sessions} started, ${r.sessionsCompleted} completed (${pct(r.completionRate)}), failed: ${failed}; ${r.reroutes} re-routes`,
    `tokens/s per session: median ${r.tokensPerSecond.median.toFixed(1)}, p99 ${r.tokensPerSecond.p99.toFixed(1)}`,
    `routes against the best (${r.routeLatencyRatio.sampled} sampled): median ${r.routeLatencyRatio.median.toFixed(2)}×, `
    + `p90 ${r.routeLatencyRatio.p90.toFixed(2)}×, max ${r.routeLatencyRatio.max.toFixed(2)}×, ${pct(r.routeLatencyRatio.withinTenPercent)} within 10%; `
    + `coordinates' median error ${r.coordinateError.start.toFixed(3)} at the start, ${r.coordinateError.end.toFixed(3)} at the end`,
    `jobs: ${r.jobs} started, ${r.jobsCompleted} completed, ${r.failovers} failovers; placement median ${r.placementMs.median.toFixed(1)} ms, `
    + `max ${r.placementMs.max.toFixed(1)} ms over up to ${r.placementMs.devicesMax} workers`,
    `cheaters: ${r.cheatersCaught} of ${r.cheaters} that worked caught`
    + (r.minutesToCatch ? ` (median ${r.minutesToCatch.median.toFixed(1)} min after joining)` : '') + `; honest flagged: ${r.honestFlagged}`,
    `ledger: ${r.economy.records} records in ${r.economy.blocks} blocks; paid ${r.economy.paid.toFixed(1)} TLK, slashed ${r.economy.slashed.toFixed(1)} TLK`,
    ...r.economy.cheats.filter((c) => c.cheaters > 0).map((c) => `  ${c.kind}: expected gain ${c.expectedGain.toFixed(2)} TLK over ${c.cheaters} cheaters`),
    `validator: ${r.validatorRequestsPerSecond.toFixed(0)} requests/s`,
  ].join('\n');
}
