import type { SpeculativeOptions, SpeculativeResult } from '../models/index.ts';
import type { BatchRunner } from './scheduler.ts';

/** How a served model drafts (`serve --speculative lookup | --draft FILE`). */
export type DraftSettings = Pick<SpeculativeOptions, 'draft' | 'maxDrafts'>;

/**
 * A batch runner that decodes a batch of one row speculatively (several tokens checked per trip through the workers or
 * hosts: a lone client waits for fewer trips) and every other batch as `run` does: rows of a batch already share each
 * trip, and a row constrained by a mask (response_format) or run through an adapter keeps the plain path. Greedy rows
 * give the same tokens; sampled rows the same distribution (speculative sampling).
 */
export function speculativeRunner(
  run: BatchRunner,
  speculate: (prompt: number[], options: SpeculativeOptions) => Promise<SpeculativeResult>,
  drafts: DraftSettings,
): { run: BatchRunner; counts: SpeculativeCounts } {
  const counts = speculativeCounts();
  return {
    counts,
    run: async (prompts, options, adapter) => {
      const row = options.rows?.[0] ?? {};
      if (prompts.length !== 1 || row.mask || adapter) return run(prompts, options, adapter);
      const r = await speculate(prompts[0], { ...row, ...drafts, ...(options.onToken ? { onToken: options.onToken } : {}) });
      countSpeculative(counts, r);
      return { tokens: [r.tokens] };
    },
  };
}

export function speculativeCounts(): SpeculativeCounts {
  return { generations: 0, tokens: 0, passes: 0, drafted: 0, accepted: 0 };
}

/** Adds one speculative generation to `counts`. */
export function countSpeculative(counts: SpeculativeCounts, r: SpeculativeResult): void {
  counts.generations++;
  counts.tokens += r.tokens.length;
  counts.passes += r.passes;
  counts.drafted += r.drafted;
  counts.accepted += r.accepted;
}

/** What speculative decoding did for a server: generations, their tokens and trips (passes), drafts checked and kept. */
export interface SpeculativeCounts {
  generations: number;
  tokens: number;
  passes: number;
  drafted: number;
  accepted: number;
}
