import type { LlamaResult } from './llama-child.ts';
import type { DecodeResult, PrefillResult, TrainResult } from './ours.ts';
import type { Adapter, TorchResult } from './refs.ts';

/** Everything one run of the GPU bench measured (written as JSON, printed as a table by printReport). */
export interface Results {
  size: string;
  software: boolean;
  budget: number;
  adapter?: Adapter;
  model?: { shape: object; parameters: number; seconds: number; int4BytesPerToken: number; f32BytesPerToken: number };
  ours?: {
    decodeInt4B1?: DecodeResult | null;
    decodeF32B1?: DecodeResult | null;
    decodeInt4B16?: DecodeResult | null;
    decodeF32B16?: DecodeResult | null;
    prefillInt4?: PrefillResult | null;
    prefillF32?: PrefillResult | null;
    train?: TrainResult | null;
  };
  references?: { llama?: LlamaResult | null; torch?: TorchResult | null };
  peakBytesPerSecond?: number | null;
  seconds?: number;
  skipped: string[];
  notes: string[];
}

interface Line {
  measure: string;
  ours: string;
  reference: string;
  ratio: string;
  target: string;
}

const fmt = (v: number | undefined | null) =>
  v === undefined || v === null || Number.isNaN(v) ? 'n/a' : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v >= 0.1 ? v.toFixed(2) : v.toPrecision(2);

/** A row of ours against one reference; `higher`: a larger value is better (tokens/s), else smaller (ms). */
function compare(measure: string, ours: number | undefined, unit: string, ref: number | undefined, refName: string, higher: boolean, target = ''): Line {
  const ratio = ours === undefined || ref === undefined ? undefined : higher ? ours / ref : ref / ours;
  const met = target && ratio !== undefined ? (ratio >= Number(/[\d.]+/.exec(target)?.[0]) ? ' met' : ' NOT met') : '';
  return {
    measure, ours: ours === undefined ? 'not measured' : `${fmt(ours)} ${unit}`,
    reference: ref === undefined ? `${refName}: not measured` : `${fmt(ref)} ${unit} (${refName})`,
    ratio: ratio === undefined ? '' : `${fmt(ratio)}×`, target: target ? `${target}${met}` : '',
  };
}

/** Prints the run's figures as a table of ratios (ours over the reference: above 1 is ours faster), then what was skipped. */
export function printReport(r: Results, log: (s: string) => void): void {
  const o = r.ours ?? {};
  const llama = r.references?.llama ?? undefined;
  const torch = r.references?.torch ?? undefined;
  const lDecode = (b: number) => llama?.decode.find((d) => d.batch === b)?.tokensPerSecond;
  const tDecode = (b: number) => torch?.decode?.find((d) => d.batch === b)?.tokensPerSecond;
  const llamaName = `llama.cpp Q4_0 ${llama?.gpu || 'CPU'}`;
  const torchName = `PyTorch bf16 ${torch?.device === 'cpu' ? 'CPU' : 'CUDA'}`;
  const lines: Line[] = [];
  for (const b of [1, 16]) {
    const i4 = b === 1 ? o.decodeInt4B1 : o.decodeInt4B16;
    const f = b === 1 ? o.decodeF32B1 : o.decodeF32B16;
    lines.push(compare(`decode int4, batch ${b} (tok/s)`, i4?.tokensPerSecond, 'tok/s', lDecode(b), llamaName, true, b === 1 ? '≥ 0.5' : ''));
    lines.push(compare(`decode int4, batch ${b} (tok/s)`, i4?.tokensPerSecond, 'tok/s', tDecode(b), torchName, true));
    lines.push(compare(`decode f32, batch ${b} (tok/s)`, f?.tokensPerSecond, 'tok/s', tDecode(b), torchName, true));
  }
  lines.push({ measure: 'decode f16', ours: 'not implemented', reference: '', ratio: '', target: 'the webgpu backend is float32 only' });
  const n = o.prefillInt4?.tokens ?? o.prefillF32?.tokens ?? 512;
  lines.push(compare(`prefill ${n} int4 (ms)`, o.prefillInt4?.ms, 'ms', llama?.prefill?.ms, llamaName, false));
  lines.push(compare(`prefill ${n} int4 (ms)`, o.prefillInt4?.ms, 'ms', torch?.prefill?.ms, torchName, false));
  lines.push(compare(`prefill ${n} f32 (ms)`, o.prefillF32?.ms, 'ms', torch?.prefill?.ms, torchName, false));
  const train = o.train;
  if (train && 'unsupported' in train) {
    lines.push({ measure: 'GPT-2 training step (ms)', ours: `not supported yet: ${train.unsupported}`, reference: torch?.train ? `${fmt(torch.train.ms)} ms (PyTorch f32)` : '', ratio: '', target: '≥ 0.3' });
  } else {
    lines.push(compare('GPT-2 training step (ms)', train?.ms, 'ms', torch?.train?.ms, 'PyTorch f32 CUDA', false, '≥ 0.3'));
  }
  const bytes = r.model?.int4BytesPerToken;
  const achieved = bytes !== undefined && o.decodeInt4B1 ? bytes * o.decodeInt4B1.tokensPerSecond : undefined;
  const gb = (v: number | undefined | null) => (v === undefined || v === null ? undefined : v / 1e9);
  lines.push(compare('bandwidth, int4 batch 1 (GB/s)', gb(achieved), 'GB/s', gb(r.peakBytesPerSecond), 'datasheet peak', true, '≥ 0.5'));
  lines.push(compare('bandwidth, int4 batch 1 (GB/s)', gb(achieved), 'GB/s', gb(torch?.copyBytesPerSecond), 'copy, PyTorch', true));
  const lBytes = bytes !== undefined && lDecode(1) !== undefined ? bytes * lDecode(1)! : undefined;
  lines.push(compare('bandwidth, llama.cpp Q4_0 batch 1 (GB/s)', gb(lBytes), 'GB/s', gb(r.peakBytesPerSecond), 'datasheet peak', true));

  const cols = ['measure', 'ours', 'reference', 'ratio', 'target'] as const;
  const width = cols.map((c) => Math.max(c.length, ...lines.map((l) => l[c].length)));
  const row = (cells: string[]) => cells.map((c, i) => c.padEnd(width[i])).join(' | ');
  console.log(row([...cols]));
  console.log(width.map((w) => '-'.repeat(w)).join('-|-'));
  for (const l of lines) console.log(row(cols.map((c) => l[c])));
  const a = r.adapter;
  console.log(`\nadapter: ${a?.kind ?? '?'} (${a?.drivers.join(', ') || 'no Vulkan driver seen'}); GPU: ${a?.gpu ?? 'nvidia-smi not here'}`);
  if (r.model) console.log(`model: Llama ${JSON.stringify(r.model.shape)}, ${(r.model.parameters / 1e6).toFixed(1)}M parameters, random (seed 0); int4 reads ${(r.model.int4BytesPerToken / 1e6).toFixed(1)} MB of weights per token`);
  console.log('ratio: ours over the reference (above 1: ours faster). decode: a 4-token prompt (1 token per row at batch 16), then 28 tokens; median of repeats after a run that traces and compiles.');
  if (torch) console.log(`PyTorch ${torch.torch}, transformers ${torch.transformers ?? 'missing'} on ${torch.device}${torch.errors.length ? `; errors: ${torch.errors.join('; ')}` : ''}`);
  if (llama) console.log(`llama.cpp: ${llama.gpu || 'CPU'} build, GPU devices: ${llama.devices.join(', ') || 'none'}, ${llama.gpuLayers} layers offloaded${llama.errors.length ? `; errors: ${llama.errors.join('; ')}` : ''}`);
  // the same weights: int4's greedy tokens should follow llama.cpp's Q4_0 (and, up to bf16's rounding, PyTorch's)
  const ours1 = o.decodeInt4B1?.tokens;
  const agree = (theirs: number[] | undefined) => {
    if (!ours1 || !theirs) return 'not measured';
    const n = Math.min(ours1.length, theirs.length);
    const first = ours1.findIndex((t, i) => i < n && t !== theirs[i]);
    return `${first === -1 ? n : first} of ${n} equal`;
  };
  console.log(`greedy tokens, int4 batch 1: llama.cpp Q4_0 ${agree(llama?.decode.find((d) => d.batch === 1)?.tokens)}, `
    + `PyTorch bf16 ${agree(torch?.decode?.find((d) => d.batch === 1)?.tokens)}`);
  for (const note of r.notes) console.log(`note: ${note}`);
  for (const s of r.skipped) console.log(`skipped: ${s}`);
  if (r.software) console.log('software adapter (--allow-software): these figures show the script runs; they say nothing about a GPU.');
  log(`done in ${fmt(r.seconds)} s`);
}
