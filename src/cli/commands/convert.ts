import { existsSync } from 'node:fs';
import { configToHF, type GGUFFileType, hfToGGUF, isGGUF, loadModel, saveModel } from '../../models/index.ts';
import { type Flags, requiredString, stringFlag, UsageError } from '../args.ts';
import type { Output } from '../output.ts';

const TYPES: readonly GGUFFileType[] = ['f32', 'f16', 'q8_0', 'q4_0'];

/**
 * `tensorlink convert --model DIR|FILE.gguf --out FILE.gguf|DIR [--type f32|f16|q8_0|q4_0]`: a Hugging Face directory to a
 * GGUF file that llama.cpp runs (the tokenizer with it), or a GGUF file (llama.cpp's, Ollama's) to a Hugging Face directory.
 */
export async function convertCommand(flags: Flags, out: Output): Promise<void> {
  const from = requiredString(flags, 'model');
  const to = requiredString(flags, 'out');
  const type = (stringFlag(flags, 'type') ?? 'f32') as GGUFFileType;
  if (!TYPES.includes(type)) throw new UsageError(`--type must be one of ${TYPES.join(', ')}, not '${type}'`);
  if (existsSync(to) && !flags.force) throw new UsageError(`${to} exists: pass --force to replace it`);
  if (isGGUF(from) === isGGUF(to)) throw new UsageError('convert goes from a directory to a .gguf file or from a .gguf file to a directory');
  const started = performance.now();
  const model = await loadModel(from);
  if (isGGUF(to)) {
    const own = model.hfStateDict();
    await hfToGGUF(to, {
      config: configToHF(model.config) as Record<string, unknown>,
      tokenizer: (model.tokenizer?.toJSON() ?? null) as Record<string, unknown> | null,
      weights: [...own].map(([name, t]) => ({ name, shape: [...t.shape] })),
      read: (name) => own.get(name)!,
      type,
    });
  } else {
    if (stringFlag(flags, 'type') !== undefined) throw new UsageError('--type is the type of a GGUF file\'s tensors: a directory is written in float32');
    await saveModel(model, to);
  }
  const seconds = (performance.now() - started) / 1000;
  out.result({ from, to, type: isGGUF(to) ? type : 'f32', parameters: model.numParameters(), seconds }, `wrote ${to} (${isGGUF(to) ? type : 'float32'}, ${model.numParameters()} parameters) in ${seconds.toFixed(1)} s`);
}
