import { basename } from 'node:path';
import { type ModelConfig, partHeldBytes } from '../models/index.ts';
import {
  type DialTarget, type HostedModelEntry, hostedJobId, type HostedSpan, type Logger, mergeModelEntries, parseModelsAnswer,
} from '../p2p/index.ts';
import { getBackend, type WeightFormat } from '../tensor/index.ts';
import { hostModel, modelHash, openModelWeights } from './hosting.ts';
import { modelFiles } from './model-files.ts';
import type { JobTable } from './jobs.ts';
import type { MemoryBudget } from './memory.ts';
import { blockThroughputs, moveTo, type PlacedSpan, routableWindow, spanLength } from './placement.ts';

/** What `--host-auto` works with. */
export interface AutoHostOptions {
  /** The checkpoints it may host (the `--models` directories it holds). */
  models: string[];
  format: WeightFormat | null;
  /** Blocks it hosts (default: as many as fit 80% of its free memory: spanLength). */
  blocks?: number;
  /** The longest random wait before it chooses (default 5 s): two hosts starting together do not race for one gap. */
  jitterMs?: number;
  /** How often it checks whether to move (default 60 s; 0: never). */
  rebalanceMs?: number;
  /** Moves only when the weakest block's throughput would rise by 1 / quality at least (default 0.75). */
  quality?: number;
}

/** A model it could host: its directory, name, manifest hash and config. */
interface Candidate {
  dir: string;
  name: string;
  hash: string;
  config: ModelConfig;
}

/**
 * `worker --host-auto`: the worker chooses what to host among the checkpoints it holds, after Petals' block
 * selection (placement.ts): the model and window of blocks whose announced throughput is lowest, after a random wait;
 * then, every `rebalanceMs`, whether moving would raise the swarm's weakest block enough (never uncovering one), in
 * which case it drops its span and loads the new one.
 */
export class AutoHost {
  private span: HostedSpan | null = null;
  private candidates: Candidate[] = [];
  private timer: NodeJS.Timeout | null = null;
  private busy = false;
  private stopped = false;

  constructor(
    private readonly options: AutoHostOptions,
    private readonly ctx: {
      jobs: JobTable; memory: MemoryBudget; self: string; log: Logger; gflops: number; verifiers: string[];
      validator: DialTarget; ask: (target: DialTarget, message: Record<string, unknown>) => Promise<Record<string, unknown>>;
      announce: () => Promise<void>;
    },
  ) {}

  /** Hashes the models it holds, waits its random delay, takes its place and starts checking. */
  async start(): Promise<void> {
    for (const dir of this.options.models) {
      const weights = openModelWeights(dir);
      try {
        this.candidates.push({ dir, name: basename(dir), hash: await modelHash(weights, modelFiles(dir)), config: weights.config });
      } finally {
        weights.close();
      }
    }
    if (this.candidates.length === 0) {
      this.ctx.log.warn('host-auto-idle', { reason: 'no checkpoint under --models to host' });
      return;
    }
    await new Promise((r) => setTimeout(r, Math.random() * (this.options.jitterMs ?? 5000)));
    await this.place();
    this.schedule();
  }

  /** The next check, at a random time around the period: hosts that see the same hole do not all move into it at once. */
  private schedule(): void {
    const period = this.options.rebalanceMs ?? 60_000;
    if (period === 0) return;
    this.timer = setTimeout(() => {
      this.rebalance()
        .catch((err: Error) => this.ctx.log.warn('rebalance-failed', { error: err.message }))
        .finally(() => {
          if (!this.stopped) this.schedule();
        });
    }, period * (0.5 + Math.random()));
  }

  /** The span it hosts now. */
  get hosted(): HostedSpan | null {
    return this.span;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
  }

  /** The index's entries of the models it holds, and every host's span of them as placement sees it. */
  private async survey(): Promise<{ c: Candidate; spans: PlacedSpan[] }[]> {
    const entries: HostedModelEntry[] = [];
    for (let page: number | undefined = 0; page !== undefined;) {
      const answer: ReturnType<typeof parseModelsAnswer> = parseModelsAnswer(await this.ctx.ask(this.ctx.validator, { type: 'models', page }));
      entries.push(...answer.models);
      page = answer.next;
    }
    const merged = mergeModelEntries(entries);
    return this.candidates.map((c) => {
      const entry = merged.find((e) => e.name === c.name && e.hash === c.hash);
      const spans = (entry?.hosts ?? []).filter((h) => h.state !== 'leaving').map((h) => ({
        peerId: h.peerId, start: h.layers[0], end: h.layers[1] + 1, throughput: h.throughput ?? 1,
      }));
      return { c, spans };
    });
  }

  /** Blocks of `c` it can hold. */
  private lengthFor(c: Candidate): number {
    // a block's weights, and where onnxruntime keeps a prepacked copy of int8/int4 matrices, about as much again
    const copies = (this.options.format === 'int8' || this.options.format === 'int4') && getBackend().prepackedBytes ? 2 : 1;
    const perBlock = copies * partHeldBytes(c.config, [1, 2], this.options.format);
    return spanLength(this.ctx.memory.free(), perBlock, c.config.layers, this.options.blocks);
  }

  /** Joins: the model whose weakest block is weakest, at its weakest window that a route reaches. */
  private async place(): Promise<void> {
    const survey = await this.survey();
    const weakest = survey
      .map(({ c, spans }) => ({ c, spans, t: blockThroughputs(spans, c.config.layers) }))
      .sort((a, b) => Math.min(...a.t) - Math.min(...b.t))[0];
    // where a route can use it whole: at a boundary routes reach, at most the blocks from there to the end
    const { start, length } = routableWindow(weakest.t, this.lengthFor(weakest.c), weakest.spans);
    await this.hostAt(weakest.c, start, length);
  }

  /** Moves when placement says the swarm's weakest block gains enough (and none is left without a host). */
  private async rebalance(): Promise<void> {
    if (this.busy || !this.span) return;
    this.busy = true;
    try {
      const span = this.span;
      const { c, spans } = (await this.survey()).find((s) => s.c.hash === span.hash)!;
      if (!spans.some((s) => s.peerId === this.ctx.self)) return; // not in the index yet (or again)
      const order = spans.map((s) => s.peerId).sort(() => Math.random() - 0.5);
      const start = moveTo(this.ctx.self, spans, c.config.layers, this.options.quality ?? 0.75, order);
      if (start === null) return;
      const length = span.layers[1] - span.layers[0] + 1;
      this.ctx.log.info('host-moving', { model: c.name, from: span.layers, to: [start, start + length - 1] });
      this.ctx.jobs.remove(hostedJobId(span));
      this.span = null;
      await this.hostAt(c, start, length);
    } finally {
      this.busy = false;
    }
  }

  private async hostAt(c: Candidate, start: number, length: number): Promise<void> {
    const spec = { name: c.name, path: c.dir, blocks: [start, start + length - 1] as [number, number] };
    this.span = await hostModel(spec, this.options.format, this.ctx);
    await this.ctx.announce();
  }
}
