/**
 * `npm run bench`: the engine's speed against the thing a user would otherwise pick,
 * each figure next to a reference measured in the same run. Prints a table and writes
 * JSON to bench/out/latest.json (or prints JSON with --json).
 *
 * usage: npm run bench [-- --quick] [-- --json]
 *          [-- --only gemm,js,crossover,elementwise,train-step,gpt2,families,p2p,distributed,pipeline,verify,load,ledger,failover,
 *                     links,compression,serve,graph,quant,hosted,lora,nat; opt-in: perplexity,speculative,fuzz,soak,rl]
 */
import '../src/polyfills.ts';
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus } from 'node:os';
import { parseArgs } from 'node:util';
import { benchElementwise } from './elementwise.ts';
import { benchFailover } from './failover.ts';
import { benchGraph } from './graph.ts';
import { benchCompression } from './compression.ts';
import { benchFamilies } from './families.ts';
import { benchFuzz } from './fuzz.ts';
import { benchSoak } from './soak.ts';
import { benchRl } from './rl.ts';
import { benchCrossover, benchJsGemm, benchOrtGemm, type Row } from './gemm.ts';
import { benchDistributed } from './distributed.ts';
import { benchLedger } from './ledger.ts';
import { benchLinks } from './links.ts';
import { benchLoad } from './load.ts';
import { benchGpt2 } from './models.ts';
import { benchHosted } from './hosted.ts';
import { benchLora } from './lora.ts';
import { benchNat } from './nat.ts';
import { benchTab } from './tab.ts';
import { benchP2p } from './p2p.ts';
import { benchPerplexity } from './perplexity.ts';
import { benchPipeline } from './pipeline.ts';
import { benchQuant } from './quant.ts';
import { benchServe } from './serve.ts';
import { benchSpeculative } from './speculative.ts';
import { benchStack } from './stack.ts';
import { benchVerify } from './verify.ts';
import { benchVerifyHosted } from './verify-hosted.ts';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
    only: { type: 'string' },
  },
});

const sections = values.only?.split(',') ?? ['gemm', 'js', 'crossover', 'elementwise', 'train-step', 'gpt2', 'families', 'p2p', 'distributed', 'pipeline', 'verify', 'load', 'ledger', 'failover', 'links', 'compression', 'serve', 'graph', 'quant', 'hosted', 'lora', 'nat', 'tab'];
const threads = [...new Set([1, Math.min(2, availableParallelism())])];
const log = (s: string) => process.stderr.write(`${s}\n`);

const rows: Row[] = [];
const started = Date.now();
if (sections.includes('gemm')) {
  log('gemm: engine (ort backend) vs raw onnxruntime-node ...');
  rows.push(...(await benchOrtGemm(threads)));
}
if (sections.includes('js')) {
  log('gemm: js backend vs blocked TypeScript GEMM ...');
  rows.push(...(await benchJsGemm()));
}
if (sections.includes('crossover')) {
  log('crossover: where ort starts to pay off ...');
  rows.push(...(await benchCrossover()));
}
if (sections.includes('elementwise')) {
  log('elementwise: ort vs js ...');
  rows.push(...(await benchElementwise()));
}
if (sections.includes('train-step')) {
  log('train-step: GPT-2-small-shaped stack vs PyTorch CPU ...');
  rows.push(...benchStack(values.quick ? [threads[threads.length - 1]] : threads, values.quick ? 4 : 12));
}

if (sections.includes('gpt2')) {
  log('gpt2: GPT-2 small forward, train step and decoding vs PyTorch CPU ...');
  rows.push(...benchGpt2(threads, 4, 128, values.quick ? 1 : 3));
}

if (sections.includes('families')) {
  log('families: a Gemma 2 and a Mixtral decoding vs a dense Llama of the same shape / the same active parameters ...');
  rows.push(...(await benchFamilies(threads)));
}

if (sections.includes('p2p')) {
  log('p2p: libp2p vs raw TCP on loopback ...');
  rows.push(...(await benchP2p()));
}

if (sections.includes('distributed')) {
  log('distributed: decoding across 1, 2, 3 stages vs local ...');
  rows.push(...(await benchDistributed()));
}

if (sections.includes('pipeline')) {
  log('pipeline: training across 1, 2, 3 worker processes at m = 1, 4, 8 vs one process ...');
  rows.push(...(await benchPipeline(values.quick ? 2 : 4)));
}

if (sections.includes('verify')) {
  log('verify: training with sampled re-execution at p = 0.01, 0.05, 0.1 and with redundancy 2 vs p = 0 ...');
  rows.push(...(await benchVerify(values.quick ? 3 : 24)));
  log('verify: hosted inference checked by activation commitments (chunk rate 0.37 and 1) and by re-execution (0.05) vs no checks ...');
  rows.push(...(await benchVerifyHosted(values.quick ? 2 : 8)));
}

if (sections.includes('load')) {
  log('load: a checkpoint onto 1, 2, 3 worker processes, cold and warm, vs loading it in one process ...');
  rows.push(...(await benchLoad(values.quick)));
}

if (sections.includes('ledger')) {
  log('ledger: records into blocks, inclusion proofs in a tree of 10^6 records, gas of a settlement and a claim on anvil ...');
  rows.push(...(await benchLedger(values.quick)));
}

if (sections.includes('failover')) {
  log('failover: time to recover from a worker killed in decoding (spare, re-plan) and in training ...');
  rows.push(...(await benchFailover()));
}

if (sections.includes('links')) {
  log('links: a forward on shaped links (one at 10 Mbit/s, network namespaces), layer-aware vs a plan through it, predicted vs measured ...');
  rows.push(...(await benchLinks(values.quick)));
}

if (sections.includes('compression')) {
  log('compression: fp16/int8 activations and DCT top-k gradients among 2 replicas on fortunes, bytes/step, held-out loss, tok/s; relay vs worker to worker ...');
  rows.push(...(await benchCompression(values.quick)));
}

if (sections.includes('serve')) {
  log('serve: the OpenAI-compatible API (streamed /v1/completions over loopback, 1, 8, 32 clients in flight), requests/s and time to first token, vs generate in process ...');
  rows.push(...(await benchServe(values.quick)));
}

if (sections.includes('graph')) {
  log('graph: whole steps as one ONNX graph on onnxruntime\'s CPU provider (GPT-2 forward, a Llama decoding step) vs op by op on ort ...');
  rows.push(...(await benchGraph(threads)));
}

if (sections.includes('quant')) {
  log('quant: a ~100M Llama trained briefly on fortunes, ours at f32/int8/int4 vs llama.cpp at F32/Q8_0/Q4_0 on its GGUF exports: decode, peak RSS, perplexity, greedy tokens ...');
  rows.push(...(await benchQuant(threads, values.quick)));
}
if (sections.includes('perplexity')) {
  log('perplexity: a small Llama trained on fortunes until its greedy text is words, held-out perplexity at f32/bf16/int8/int4 on js, ort, webgpu and llama.cpp (GGUF F32/BF16/Q8_0/Q4_0) ...');
  rows.push(...(await benchPerplexity(values.quick)));
}
if (sections.includes('fuzz')) {
  log('fuzz: a million fuzzed frames on each protocol a stranger reaches (control, stage, probe, result, gossip), a validator and a worker as processes ...');
  rows.push(...(await benchFuzz(values.quick, log)));
}
if (sections.includes('soak')) {
  log('soak: a host serving 500 sessions opened and closed over 10 minutes, a worker through 50 training jobs, their resident memory after each round ...');
  rows.push(...(await benchSoak(values.quick, log)));
}
if (sections.includes('rl')) {
  log('rl: GRPO on 2-digit addition from a weak start, in one process and over three worker processes: held-out exact match, rollout tokens/s ...');
  rows.push(...(await benchRl(values.quick, log, 'bench/out/rl.svg')));
}
if (sections.includes('speculative')) {
  log('speculative: a model three hosts serve 25 ms away (delay relays), greedy tokens/s with prompt-lookup drafts and a draft model vs without ...');
  rows.push(...(await benchSpeculative(values.quick)));
}
if (sections.includes('hosted')) {
  log('hosted: a model two hosts serve, used by 1, 4 and 8 users at once (a session each, or batched at a gateway) ...');
  rows.push(...(await benchHosted()));
}
if (sections.includes('nat')) {
  log('nat: a worker behind an nftables NAT reached over WebRTC and through the validator\'s relay, against one on a public address ...');
  rows.push(...(await benchNat()));
}
if (sections.includes('tab')) {
  log('tab: a browser tab\'s engine (the js backend in a Web Worker of headless Chromium) against a Node worker\'s ...');
  rows.push(...(await benchTab()));
}
if (sections.includes('lora')) {
  log('lora: a worker\'s accounted memory for a LoRA job (float32 and int4 base) against full training of its section ...');
  rows.push(...(await benchLora()));
}

const report = {
  date: new Date().toISOString(),
  node: process.version,
  cpu: cpus()[0]?.model ?? 'unknown',
  cores: availableParallelism(),
  seconds: (Date.now() - started) / 1000,
  rows,
};
mkdirSync(new URL('./out/', import.meta.url), { recursive: true });
writeFileSync(new URL('./out/latest.json', import.meta.url), `${JSON.stringify(report, null, 2)}\n`);

if (values.json) {
  process.stdout.write(`${JSON.stringify(report)}\n`);
} else {
  const fmt = (v: number) =>
    Number.isNaN(v) ? 'n/a' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  const table = rows.map((r) => ({
    case: r.case,
    value: `${fmt(r.value)} ${r.unit}`,
    reference: `${fmt(r.referenceValue)} ${r.unit} (${r.reference})`,
    ratio: fmt(r.ratio),
    target: r.target ?? '',
  }));
  const cols = ['case', 'value', 'reference', 'ratio', 'target'] as const;
  const width = cols.map((c) => Math.max(c.length, ...table.map((t) => t[c].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(width[i])).join(' | ');
  console.log(line([...cols]));
  console.log(width.map((w) => '-'.repeat(w)).join('-|-'));
  for (const t of table) console.log(line(cols.map((c) => t[c])));
  console.log(
    `\n${report.cpu}, ${report.cores} cores, Node ${report.node}; ${report.seconds.toFixed(0)} s. JSON: bench/out/latest.json`,
  );
}
// a section's libraries may keep a handle open after it is done (a gossip heartbeat, a socket being torn down): the
// report is written, so the run ends here
process.exit(0);
