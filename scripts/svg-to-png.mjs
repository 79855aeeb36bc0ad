// Renders an SVG (the simulation's report: `npm run simulate -- --svg FILE`) to a PNG in Debian's Chromium, as the
// README's pictures are made:  node scripts/svg-to-png.mjs IN.svg OUT.png
import { readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  process.stderr.write('usage: node scripts/svg-to-png.mjs IN.svg OUT.png\n');
  process.exit(2);
}
const svg = readFileSync(input, 'utf8');
const width = Number(/width="(\d+)"/.exec(svg)?.[1] ?? 960);
const height = Number(/height="(\d+)"/.exec(svg)?.[1] ?? 720);
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] });
try {
  const page = await browser.newPage({ viewport: { width, height } });
  await page.setContent(`<html><body style="margin:0">${svg}</body></html>`);
  await page.screenshot({ path: output, clip: { x: 0, y: 0, width, height } });
} finally {
  await browser.close();
}
