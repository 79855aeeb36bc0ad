/**
 * The simulation's report as a picture (an SVG, no dependency): sessions completed and failed a minute, peers online,
 * each hosted model's least-held block (its hosts), and cheaters caught, over virtual time.
 * `npm run simulate -- --svg FILE`; scripts/plot-simulation.ts renders it to a PNG in Chromium.
 */
import type { SimulationReport } from './simulate.ts';

const W = 960;
const PANEL = 200;
const LEFT = 70;
const RIGHT = 160;
const TOP = 40;
const GAP = 40;
const COLOURS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];

interface Line {
  label: string;
  colour: string;
  points: [number, number][];
}

/** One panel: lines over minutes, its y axis from 0 to the largest value (or `yMax`). */
function panel(top: number, title: string, minutes: number, lines: Line[], yMax?: number, unit = ''): string {
  const width = W - LEFT - RIGHT;
  const max = yMax ?? nice(Math.max(1, ...lines.flatMap((l) => l.points.map((p) => p[1]))));
  const x = (m: number) => LEFT + (m / Math.max(1, minutes)) * width;
  const y = (v: number) => top + PANEL - (v / max) * PANEL;
  const out = [`<text x="${LEFT}" y="${top - 10}" font-size="15" font-weight="bold">${title}</text>`];
  out.push(`<rect x="${LEFT}" y="${top}" width="${width}" height="${PANEL}" fill="none" stroke="#999"/>`);
  for (let k = 0; k <= 4; k++) {
    const v = (max * k) / 4;
    out.push(`<line x1="${LEFT}" x2="${LEFT + width}" y1="${y(v)}" y2="${y(v)}" stroke="#eee"/>`);
    out.push(`<text x="${LEFT - 6}" y="${y(v) + 4}" font-size="11" text-anchor="end">${Number.isInteger(v) ? v : v.toFixed(2)}${unit}</text>`);
  }
  const step = minutes <= 60 ? 10 : minutes <= 240 ? 30 : 60;
  for (let m = 0; m <= minutes; m += step) out.push(`<text x="${x(m)}" y="${top + PANEL + 14}" font-size="11" text-anchor="middle">${m}</text>`);
  lines.forEach((l, i) => {
    const d = l.points.map(([m, v], j) => `${j === 0 ? 'M' : 'L'}${x(m).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    out.push(`<path d="${d}" fill="none" stroke="${l.colour}" stroke-width="2"/>`);
    out.push(`<rect x="${LEFT + width + 12}" y="${top + 8 + 18 * i}" width="12" height="3" fill="${l.colour}"/>`);
    out.push(`<text x="${LEFT + width + 30}" y="${top + 13 + 18 * i}" font-size="12">${l.label}</text>`);
  });
  return out.join('\n');
}

/** The least of 1, 2, 2.5, 5 times a power of ten at or above `x`: an axis that ends on a round number. */
function nice(x: number): number {
  const p = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((v) => v >= x)!;
}

export function reportSvg(r: SimulationReport): string {
  const minutes = r.virtualHours * 60;
  const perMinute = r.series.length > 1 ? r.series[1].minute - r.series[0].minute : 1;
  let caught = 0;
  const panels = [
    panel(TOP, `Sessions a minute (${r.sessions.toLocaleString('en')} in all, ${(100 * r.completionRate).toFixed(1)}% completed)`, minutes, [
      { label: 'completed', colour: COLOURS[2], points: r.series.slice(1).map((s) => [s.minute, s.completed / perMinute]) },
      { label: 'failed', colour: COLOURS[3], points: r.series.slice(1).map((s) => [s.minute, s.failed / perMinute]) },
    ]),
    panel(TOP + PANEL + GAP + 20, `Peers online (of ${r.peers.toLocaleString('en')}; median lifetime ${String(r.scenario.medianLifetimeHours)} h)`, minutes, [
      { label: 'online', colour: COLOURS[0], points: r.series.map((s) => [s.minute, s.online]) },
    ]),
    panel(TOP + 2 * (PANEL + GAP + 20), 'Hosted models: hosts of the least-held block', minutes, Object.keys(r.coverage[0]?.models ?? {}).map((name, i) => ({
      label: name, colour: COLOURS[i % COLOURS.length], points: r.coverage.map((c) => [c.minute, c.leastHosts[name]] as [number, number]),
    }))),
    panel(TOP + 3 * (PANEL + GAP + 20), `Cheaters caught (${r.cheatersCaught} of ${r.cheaters} that worked; honest flagged: ${r.honestFlagged})`, minutes, [
      { label: 'caught', colour: COLOURS[4], points: r.series.map((s) => [s.minute, (caught += s.caught)]) },
    ]),
  ];
  const height = TOP + 4 * (PANEL + GAP + 20) + 10;
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="white"/>
${panels.join('\n')}
<text x="${W / 2}" y="${height - 12}" font-size="12" text-anchor="middle">virtual minutes</text>
</svg>
`;
}
