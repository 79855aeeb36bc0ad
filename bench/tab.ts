import { existsSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { localSwarm } from '../src/swarm/index.ts';
import { setBackend } from '../src/tensor/index.ts';
import { engineGflops } from '../src/worker/engine-check.ts';
import type { Row } from './gemm.ts';

const SECTION = 'tab';
const CHROMIUM = '/usr/bin/chromium';
const TRIES = 5;
const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

/**
 * A browser tab's engine against a Node worker's, on this machine: the GFLOP/s of the js backend's 256³ product, as
 * /lend measures it in a Web Worker of headless Chromium with each GEMM (TypeScript: browser-js; WebAssembly SIMD:
 * browser-wasm; the median of 5 page loads) and as a worker measures it in this process (its GEMM in WebAssembly SIMD
 * too; the median of 5). Needs Debian's Chromium; skipped with a note otherwise.
 */
export async function benchTab(): Promise<Row[]> {
  if (!existsSync(CHROMIUM)) {
    process.stderr.write(`tab: skipped, ${CHROMIUM} is missing (apt-get install chromium)\n`);
    return [];
  }
  setBackend('js');
  const node = median(Array.from({ length: TRIES }, () => engineGflops()));
  const swarm = await localSwarm({ workers: 0, backend: 'js', dashboard: '127.0.0.1:0', handleSignals: false });
  const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--allow-loopback-in-peer-connection'] });
  try {
    const runs: number[] = [];
    const wasmRuns: number[] = [];
    for (let i = 0; i < TRIES; i++) {
      const page = await browser.newPage();
      await page.goto(`${swarm.dashboard}/lend`);
      const engine = page.locator('#engine[data-gflops]');
      await engine.waitFor({ timeout: 60_000 });
      runs.push(Number(await engine.getAttribute('data-gflops')));
      const wasm = await engine.getAttribute('data-wasm-gflops');
      if (wasm !== null) wasmRuns.push(Number(wasm));
      await page.close();
    }
    const tab = median(runs);
    const wasm = wasmRuns.length > 0 ? median(wasmRuns) : null;
    process.stderr.write(`  tab: ${tab.toFixed(2)} GFLOP/s in Chromium's Web Worker (js backend, TypeScript GEMM)`
      + `${wasm === null ? '' : `, ${wasm.toFixed(2)} with the WebAssembly GEMM`}; ${node.toFixed(2)} GFLOP/s in Node (js backend, WebAssembly GEMM)\n`);
    const reference = { unit: 'GFLOP/s', reference: 'a Node worker\'s js backend (WebAssembly GEMM), same product', referenceValue: node };
    return [
      { section: SECTION, case: 'a browser tab\'s engine (browser-js: the TypeScript GEMM, Web Worker, Chromium): 256³ product', value: tab, ...reference, ratio: tab / node },
      ...(wasm === null
        ? []
        : [{
            section: SECTION, case: 'a browser tab\'s engine (browser-wasm: the GEMM in WebAssembly SIMD, the same bits): 256³ product',
            value: wasm, ...reference, ratio: wasm / node,
          }]),
    ];
  } finally {
    await browser.close();
    await swarm.close();
  }
}
