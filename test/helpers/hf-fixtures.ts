/**
 * The Hugging Face fixtures of issue #29 (test/fixtures/hf/<name>/, made by make_hf_fixtures.py
 * beside them with transformers itself): what transformers computed on each tiny checkpoint, and
 * its gradients under the checkpoint's names.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { readSafetensors } from '../../src/io/index.ts';
import type { Tensor } from '../../src/tensor/index.ts';

export const HF_FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));

/** The fixture folders, sorted. */
export function hfFixtureNames(): string[] {
  return readdirSync(HF_FIXTURES).filter((n) => statSync(join(HF_FIXTURES, n)).isDirectory()).sort();
}

export interface HFReference {
  dir: string;
  /** config.json as written. */
  config: Record<string, unknown>;
  /** int32 [2, 48]. */
  inputIds: Tensor;
  /** float32 [2, 48, V]. */
  logits: Tensor;
  /** The mean loss over the 2 × 47 shifted targets. */
  loss: number;
  prompt: number[];
  /** transformers' greedy continuation of `prompt`, with its KV cache. */
  greedy: number[];
  /** The checkpoint's weight names (reference.json's checkpoint_keys). */
  checkpointKeys: string[];
  /** transformers' gradients under its run-time names. */
  grads: Map<string, Tensor>;
}

export function readHFReference(name: string): HFReference {
  const dir = join(HF_FIXTURES, name);
  const meta = JSON.parse(readFileSync(join(dir, 'reference.json'), 'utf8')) as {
    loss: number;
    prompt_len: number;
    checkpoint_keys: string[];
  };
  const ref = readSafetensors(join(dir, 'reference.safetensors'));
  const generated = Array.from(ref.get('generated')!.data);
  return {
    dir,
    config: JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>,
    inputIds: ref.get('input_ids')!,
    logits: ref.get('logits')!,
    loss: meta.loss,
    prompt: generated.slice(0, meta.prompt_len),
    greedy: generated.slice(meta.prompt_len),
    checkpointKeys: meta.checkpoint_keys,
    grads: readSafetensors(join(dir, 'grads.safetensors')),
  };
}

export interface Grad {
  shape: number[];
  data: Float32Array;
}

/**
 * transformers' gradients under the checkpoint's names. Where the two disagree: GPT-NeoX's head
 * is `lm_head.weight` at run time and `embed_out.weight` in the checkpoint; a MoE layer's
 * experts are fused at run time, `mlp.experts.gate_up_proj` [E, 2I, H] (the gate's rows, then
 * the up projection's) and `mlp.experts.down_proj` [E, H, I], and named one by one in the
 * checkpoint: Mixtral's `block_sparse_moe.experts.E.w1|w3|w2.weight` (with its router
 * `block_sparse_moe.gate.weight`), Qwen3-MoE's `mlp.experts.E.gate_proj|up_proj|down_proj.weight`.
 * Only names the checkpoint has are kept.
 */
export function checkpointGrads(grads: Map<string, Tensor>, checkpointKeys: readonly string[]): Map<string, Grad> {
  const keys = new Set(checkpointKeys);
  const out = new Map<string, Grad>();
  const put = (name: string, shape: number[], data: Float32Array) => {
    if (keys.has(name)) out.set(name, { shape, data });
  };
  for (const [name, g] of grads) {
    const data = g.data as Float32Array;
    const fused = /^(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$/.exec(name);
    if (fused) {
      const [, layer, which] = fused;
      const [experts, rows, cols] = g.shape;
      const size = rows * cols;
      for (let e = 0; e < experts; e++) {
        const m = data.subarray(e * size, (e + 1) * size);
        const mixtral = `${layer}.block_sparse_moe.experts.${e}`;
        const qwen = `${layer}.mlp.experts.${e}`;
        if (which === 'down_proj') {
          put(`${mixtral}.w2.weight`, [rows, cols], m); // [H, I]
          put(`${qwen}.down_proj.weight`, [rows, cols], m);
        } else {
          const half = (rows / 2) * cols; // [I, H] each: the gate's rows first, then up's
          for (const [part, mix, qw] of [[m.subarray(0, half), 'w1', 'gate_proj'], [m.subarray(half), 'w3', 'up_proj']] as const) {
            put(`${mixtral}.${mix}.weight`, [rows / 2, cols], part);
            put(`${qwen}.${qw}.weight`, [rows / 2, cols], part);
          }
        }
      }
      continue;
    }
    put(name, [...g.shape], data);
    put(name.replace(/\.mlp\.gate\.weight$/, '.block_sparse_moe.gate.weight'), [...g.shape], data);
    if (name === 'lm_head.weight') put('embed_out.weight', [...g.shape], data);
  }
  return out;
}

/**
 * The names a refusal of `config` may give: its model_type and its fields (`rope_scaling`,
 * `sliding_window`, ...).
 */
export function configNames(config: Record<string, unknown>): string[] {
  return [String(config.model_type), ...Object.keys(config)];
}
