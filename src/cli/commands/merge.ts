import { existsSync } from 'node:fs';
import { loadModel, mergeAdapter, saveModel } from '../../models/index.ts';
import { type Flags, requiredString, UsageError } from '../args.ts';
import type { Output } from '../output.ts';

/**
 * `tensorlink merge --model DIR --adapter DIR --out DIR`: the base with a PEFT LoRA adapter folded into its weights
 * (W + alpha/r · B A), written in the Hub's layout (config, safetensors, tokenizer): a plain model that computes what
 * the base computed through the adapter.
 */
export async function mergeCommand(flags: Flags, out: Output): Promise<void> {
  const from = requiredString(flags, 'model');
  const adapter = requiredString(flags, 'adapter');
  const to = requiredString(flags, 'out');
  if (existsSync(to) && !flags.force) throw new UsageError(`${to} exists: pass --force to replace it`);
  const started = performance.now();
  const model = await loadModel(from, { adapter });
  const layers = mergeAdapter(model);
  for (const p of model.parameters()) p.requiresGrad = true;
  await saveModel(model, to);
  const seconds = (performance.now() - started) / 1000;
  out.result({ out: to, layers, seconds }, `merged the adapter into ${layers} layers of ${from}: ${to} (${seconds.toFixed(1)} s)`);
}
