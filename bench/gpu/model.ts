import { join } from 'node:path';
import {
  byteLevelTokenizerJson, type CausalLM, configToHF, createModel, type DecoderConfig, hfToGGUF, HFTokenizer, saveModel,
} from '../../src/models/index.ts';
import { holdPacked, type PackedMatrix, unpackMatrix } from '../../src/tensor/index.ts';

/**
 * The GPU bench's model, made here by the project's own code, never downloaded: a Llama of the
 * given shape whose every matrix is random Q4_0 blocks (seeded: random 4-bit values, each block's
 * scale one of 17 float16 values from 8/4096 to 24/4096, so the weights' spread is about 0.02, as
 * createModel's init), its norms 1. The same weights three ways:
 * - `int4`: held as those blocks (our int4, MatMulNBits);
 * - `f32`: the blocks' values in float32 (exactly), saved as safetensors for transformers;
 * - a GGUF file at Q4_0 with the blocks written as they are, for llama.cpp.
 * So int4, f32, bf16 (PyTorch) and Q4_0 (llama.cpp) all compute one function (up to bf16's rounding).
 * Random blocks rather than createModel's init + quantization: a 1.1B model's normal draws and Q4_0
 * rounding take minutes in js, these take seconds.
 */
export interface BenchModels {
  int4: CausalLM;
  f32: CausalLM;
  /** The Hugging Face folder (config.json, model.safetensors in float32). */
  hfDir: string;
  /** The GGUF file at Q4_0. */
  gguf: string;
}

/** xorshift32: a fast seeded stream of 32-bit words. */
function words(seed: number): () => number {
  let x = seed >>> 0 || 0x9e3779b9;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
}

/** A random int4 matrix [rows, cols] (cols a multiple of 32) in PackedMatrix's layout. */
function randomInt4(rows: number, cols: number, next: () => number): PackedMatrix {
  const blocks = rows * (cols / 32);
  const data = new Uint8Array(blocks * 16);
  const view = new Uint32Array(data.buffer);
  for (let i = 0; i < view.length; i++) view[i] = next();
  const scales = new Float32Array(blocks);
  for (let i = 0; i < blocks; i++) scales[i] = (8 + (next() % 17)) / 4096;
  return { format: 'int4', rows, cols, data, scales };
}

/**
 * Makes the bench's model (see BenchModels) under `dir`.
 * @example
 * const { int4, f32, gguf } = await benchModels(config, '/tmp/work', 0)
 */
export async function benchModels(
  config: DecoderConfig, dir: string, seed: number, log: (s: string) => void = () => {},
): Promise<BenchModels> {
  const int4 = createModel(config, { init: false });
  const f32 = createModel(config, { init: false });
  const next = words(seed + 1);
  const f32State = f32.hfStateDict();
  for (const [name, t] of int4.hfStateDict()) {
    const target = f32State.get(name)!;
    if (t.ndim === 2) {
      const packed = randomInt4(t.shape[0], t.shape[1], next);
      holdPacked(t, packed);
      target.data.set(unpackMatrix(packed));
    } else {
      t.data.fill(1);
      target.data.fill(1);
    }
  }
  const tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  int4.tokenizer = tokenizer;
  f32.tokenizer = tokenizer;
  int4.eval();
  f32.eval();
  log('weights made; writing safetensors ...');
  const hfDir = join(dir, 'hf');
  await saveModel(f32, hfDir);
  log('writing GGUF ...');
  const gguf = join(dir, 'model-q4_0.gguf');
  const state = int4.hfStateDict();
  await hfToGGUF(gguf, {
    config: configToHF(config), tokenizer: tokenizer.toJSON() as Record<string, unknown>,
    weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape], ...(t.packed ? { format: 'int4' as const } : {}) })),
    read: (n) => state.get(n)!.packed ?? state.get(n)!,
  });
  return { int4, f32, hfDir, gguf };
}
