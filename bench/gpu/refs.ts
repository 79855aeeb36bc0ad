import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadBackend, tensor } from '../../src/tensor/index.ts';
import type { LlamaJob, LlamaResult } from './llama-child.ts';
import { runJson } from '../child-json.ts';

/**
 * What the GPU bench measures against, and what it runs on: the adapter onnxruntime's WebGPU
 * provider was given (read from the Vulkan driver this process loaded), the GPU's datasheet
 * bandwidth, and the two references, each in its own process: PyTorch with transformers
 * (torch_ref.py) and llama.cpp through node-llama-cpp (llama-child.ts).
 */

/** This module's folder: bench/gpu, or the carried bundle's (pack.sh), where llama-child.mjs lies beside it. */
const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository's root: the bench runs from there (run.sh). */
const REPO = process.cwd();

/** The adapter the webgpu backend computes on. */
export interface Adapter {
  kind: 'nvidia' | 'software' | 'other' | 'unknown';
  /** The Vulkan driver libraries mapped into this process once the backend ran a graph. */
  drivers: string[];
  /** nvidia-smi's name, memory and driver, where it answers. */
  gpu: string | null;
}

/** Vulkan drivers (ICDs) by the library a loader maps: NVIDIA's, the software ones (SwiftShader, Mesa's lavapipe), others. */
const DRIVER = /libGLX_nvidia|libnvidia-|libvk_swiftshader|libvulkan_[a-z0-9_]+\.so/;

/**
 * Runs a graph on the webgpu backend, then reads which Vulkan driver this process loaded: the
 * adapter Dawn took (a Vulkan loader restricted by VK_ICD_FILENAMES or VK_DRIVER_FILES, as
 * run.sh sets them, offers that driver's devices alone).
 */
export async function webgpuAdapter(): Promise<Adapter> {
  const x = tensor([1, 2, 3, 4], [2, 2]).to('webgpu');
  await x.matmul(x).toHost();
  x.dispose();
  loadBackend('webgpu');
  const maps = readFileSync('/proc/self/maps', 'utf8').split('\n');
  const drivers = [...new Set(maps.map((l) => l.split(/\s+/)[5] ?? '').filter((p) => DRIVER.test(p)))];
  const names = drivers.join(' ');
  const kind = /nvidia/i.test(names) ? 'nvidia' : /swiftshader|lvp/.test(names) ? 'software' : drivers.length > 0 ? 'other' : 'unknown';
  return { kind, drivers, gpu: nvidiaSmi() };
}

/** nvidia-smi's "name, memory, driver" of GPU 0, or null where it is missing. */
export function nvidiaSmi(): string | null {
  try {
    return execFileSync('nvidia-smi', ['--query-gpu=name,memory.total,driver_version', '--format=csv,noheader'], { encoding: 'utf8' })
      .split('\n')[0].trim() || null;
  } catch {
    return null;
  }
}

/** Datasheet memory bandwidths (bytes/s) by nvidia-smi's name, most specific first. */
const PEAKS: [RegExp, number][] = [
  [/H200/, 4.8e12], [/H100 NVL/, 3.9e12], [/H100 PCIe/, 2.0e12], [/H100/, 3.35e12], [/GH200/, 4.0e12],
  [/A100.*80GB.*PCIe/, 1.935e12], [/A100.*80GB/, 2.039e12], [/A100/, 1.555e12], [/L40S|L40/, 0.864e12], [/L4\b/, 0.3e12],
  [/A10\b/, 0.6e12], [/RTX 4090/, 1.008e12], [/RTX 3090/, 0.936e12],
];

/** The datasheet bandwidth of the GPU nvidia-smi names, or null where the table has none. */
export function peakBandwidth(gpu: string | null): number | null {
  if (gpu === null) return null;
  return PEAKS.find(([re]) => re.test(gpu))?.[1] ?? null;
}

export interface TorchJob {
  model_dir: string;
  device: 'cuda' | 'cpu';
  batches: number[][][];
  new_tokens: number;
  repeats: number;
  prefill: number[];
  gpt2: { batch: number; seq: number; vocab: number; hidden: number; layers: number; heads: number; positions: number } | null;
  threads: number;
}

export interface TorchResult {
  torch: string;
  transformers?: string;
  device: string;
  copyBytesPerSecond?: number;
  loadSeconds?: number;
  decode?: { batch: number; stepMs: number; tokensPerSecond: number; tokens: number[] }[];
  prefill?: { tokens: number; ms: number; tokensPerSecond: number };
  train?: { ms: number; loss: number; dtype: string; attention: string };
  errors: string[];
}

const PYTHON = process.env.TL_PYTHON ?? 'python3';

/** Whether python3 has torch and transformers, and CUDA: a reason to skip, or the device to run on. */
export function torchDevice(allowCpu: boolean): { device: 'cuda' | 'cpu' } | { skip: string } {
  let probe: string;
  try {
    probe = execFileSync(PYTHON, ['-c', 'import torch, transformers; print(torch.cuda.is_available())'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    const why = ((err as { stderr?: string }).stderr ?? String(err)).trim().split('\n').pop();
    return { skip: `${PYTHON} with torch and transformers is missing here (${why})` };
  }
  if (probe.trim() === 'True') return { device: 'cuda' };
  return allowCpu ? { device: 'cpu' } : { skip: 'PyTorch sees no CUDA device here' };
}

/** The transformers + PyTorch reference (torch_ref.py). */
export function runTorch(job: TorchJob): Promise<TorchResult> {
  return runJson<TorchResult>(PYTHON, [join(REPO, 'bench', 'gpu', 'torch_ref.py'), JSON.stringify(job)], { ...process.env, PYTHONUNBUFFERED: '1' });
}

/** node-llama-cpp's entry module: TL_LLAMA_MODULE, the carried copy (run.sh's TL_CARRY), or bench/llama-cpp's install. */
export function llamaModule(): { module: string; builds: ('vulkan' | 'cuda' | 'cpu')[] } | { skip: string } {
  const roots = [process.env.TL_CARRY ? join(process.env.TL_CARRY, 'llama', 'node_modules') : null, join(REPO, 'bench', 'llama-cpp', 'node_modules')];
  for (const root of roots) {
    if (root === null) continue;
    const module = process.env.TL_LLAMA_MODULE ?? join(root, 'node-llama-cpp', 'dist', 'index.js');
    if (!existsSync(module)) continue;
    // node-llama-cpp's prebuilt binaries beside it: its GPU builds, and the CPU one (carried copies have no CPU build)
    const built = { vulkan: 'linux-x64-vulkan', cuda: 'linux-x64-cuda', cpu: 'linux-x64' } as const;
    const builds = (Object.keys(built) as (keyof typeof built)[]).filter((b) => existsSync(join(root, '@node-llama-cpp', built[b])));
    return { module, builds };
  }
  return { skip: 'node-llama-cpp is not here: `npm ci --prefix bench/llama-cpp` on a machine with a registry, or carry it (bench/gpu/pack.sh)' };
}

/** llama.cpp on the same GGUF file, in its own process (llama-child.ts, or the bundle's llama-child.mjs). */
export function runLlama(job: LlamaJob): Promise<LlamaResult> {
  const bundled = fileURLToPath(import.meta.url).endsWith('.mjs');
  const args = bundled ? [join(HERE, 'llama-child.mjs')] : ['--import', import.meta.resolve('tsx'), join(HERE, 'llama-child.ts')];
  return runJson<LlamaResult>(process.execPath, [...args, JSON.stringify(job)]);
}
