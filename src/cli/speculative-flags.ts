import { existsSync } from 'node:fs';
import { type Drafter, type DraftKind, loadModel, modelDrafter, type SpeculativeResult } from '../models/index.ts';
import { type Flags, intFlag, stringFlag, UsageError } from './args.ts';

/**
 * `--speculative lookup` or `--draft DIR` (a small model of the same tokenizer, held whole here), and
 * `--draft-tokens N`: how generate drafts, or null without speculative decoding.
 */
export async function speculativeFlags(flags: Flags, vocabSize: number): Promise<{ draft: DraftKind | Drafter; maxDrafts: number } | null> {
  const kind = stringFlag(flags, 'speculative');
  const dir = stringFlag(flags, 'draft');
  if (kind !== undefined && kind !== 'lookup') throw new UsageError(`--speculative takes lookup, got '${kind}'`);
  if (kind !== undefined && dir !== undefined) throw new UsageError('--speculative lookup and --draft DIR are two ways of drafting: give one');
  if (kind === undefined && dir === undefined) {
    if (flags['draft-tokens'] !== undefined) throw new UsageError('--draft-tokens needs --speculative lookup or --draft DIR');
    return null;
  }
  const maxDrafts = intFlag(flags, 'draft-tokens', 8, 1);
  if (dir === undefined) return { draft: 'lookup', maxDrafts };
  if (!existsSync(dir)) throw new UsageError(`--draft ${dir}: no such model (a checkpoint's folder or a .gguf file)`);
  return { draft: modelDrafter(await loadModel(dir), vocabSize), maxDrafts };
}

/** Trips through the model (one a token without speculation) and, with it, the drafts: what `--json` reports. */
export function passesOf(tokens: number, spec: SpeculativeResult | null) {
  const acceptance = spec && spec.drafted > 0 ? spec.accepted / spec.drafted : 0;
  return {
    passes: spec ? spec.passes : tokens,
    drafts: spec ? { drafted: spec.drafted, accepted: spec.accepted, acceptance } : null,
  };
}
