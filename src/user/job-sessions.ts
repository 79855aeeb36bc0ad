import { randomUUID } from 'node:crypto';
import { InvalidArgumentError, VerificationError } from '../errors.ts';
import {
  defaultPositions, type GenerateOptions, generateSpeculative, generateWith, runLayers, type SpeculativeOptions, type SpeculativeResult,
  type StepModel,
} from '../models/index.ts';
import { noGrad, type Tensor } from '../tensor/index.ts';
import { COMMIT_CHUNK } from '../verify/index.ts';
import { deadlineMs, predictedSeconds } from './failover.ts';
import { ownEnds } from './job-stage.ts';
import type { JobPlacement } from './placement.ts';
import type { JobRecovery } from './recovery.ts';
import type { Replanner } from './replanner.ts';
import type { ResultInbox } from './result-inbox.ts';
import { SessionSteps } from './session-steps.ts';
import type { AuditVerdict, JobVerifier } from './verifier.ts';

/** The parts of a job its sessions run on, and what they ask of the job as a whole. */
export interface SessionsContext {
  placement: JobPlacement;
  recovery: JobRecovery;
  replanner: Replanner;
  verifier: JobVerifier | null;
  /** Where chained results arrive; null: the user relays hidden states between workers. */
  inbox: ResultInbox | null;
  /** The user runs the model's ends itself (privacy 'ends'). */
  keepEnds: boolean;
  /** Tokens per step the plan was made for: its predicted seconds scale from there. */
  planTokens: number;
  /** The least a request waits before its worker is taken for lost. */
  deadlineFloorMs: number;
  /** Whether the job trains (its sections then move only with the trainer). */
  trains(): boolean;
  /** Settles the checks still under way (a training step's re-runs): what a session reads after is verified. */
  settle(): Promise<unknown>;
  /** Workers caught in a session of a training job: the job rolled back and replayed on trusted workers. */
  caught(failed: AuditVerdict[]): Promise<void>;
}

/**
 * A distributed job's sessions: generation and logits across its workers, replica 0 of each
 * section chained worker to worker (or relayed by the user), the user's ends run on its own
 * model, every result checked by its record; a lost worker replaced and the session replayed.
 */
export class JobSessions {
  constructor(private readonly ctx: SessionsContext) {}

  /** Continues `prompts` (a batch of one or more) across the workers. */
  generate(prompts: number[][], options: GenerateOptions): Promise<number[][]> {
    return this.session((s) => generateWith(this.stepModel(s), prompts, options), (t) => t[0]?.length ?? 0);
  }

  /**
   * Continues one prompt by speculative decoding (models/generation/speculative.ts): each pass through the workers
   * checks the next token and its drafts as one step, and the workers keep the accepted positions only. A pass never
   * crosses a chunk of commitments (COMMIT_CHUNK positions), so cutting it never reopens a chunk a worker committed to.
   */
  speculate(prompt: number[], options: SpeculativeOptions): Promise<SpeculativeResult> {
    if (this.ctx.placement.all.some((s) => s.remote.codec)) {
      throw new InvalidArgumentError('speculative decoding needs hidden states that travel uncompressed (a job without compressed activations)');
    }
    if ((this.ctx.verifier?.redundancy ?? 1) > 1) throw new InvalidArgumentError('speculative decoding does not combine with --redundancy yet');
    return this.session(async (s) => {
      const model: StepModel = {
        ...this.stepModel(s, true),
        truncate: (length) => s.keep(length),
        passLimit: (position) => COMMIT_CHUNK - (position % COMMIT_CHUNK),
      };
      return generateSpeculative(model, prompt, options);
    }, (r) => r.tokens.length);
  }

  /** The logits [B, T, V] of token ids [B, T] (int32), computed across the workers in a session of its own. */
  logits(ids: Tensor): Promise<Tensor> {
    if (ids.dtype !== 'int32' || ids.ndim !== 2) throw new InvalidArgumentError(`logits takes int32 ids [batch, time], got ${ids.dtype} [${ids.shape}]`);
    const positions = defaultPositions(ids.shape[0], ids.shape[1], 0);
    return this.session(async (s) => this.stepModel(s).step(ids, { positions, keyMask: null }), () => 1);
  }

  /** Runs the user's first end (the embedding) or its last (final norm and head): the first layer it holds, or the last two. */
  private runEnd(which: 'first' | 'last', x: Tensor, positions: Tensor): Tensor {
    const source = this.ctx.placement.source;
    const layers = ownEnds(source).layers;
    const run = which === 'first' ? layers.slice(0, 1) : layers.slice(layers.length - 2);
    return noGrad(() => runLayers(run, x, { positions }, source.config.maxPositions));
  }

  /** A new session's steps on the job's workers as they are (and as failovers leave them). */
  private newSession(): SessionSteps {
    const { placement, recovery, verifier, inbox, planTokens, deadlineFloorMs } = this.ctx;
    return new SessionSteps({
      jobId: () => placement.jobId,
      sections: () => placement.sections,
      inbox,
      verifier,
      format: placement.source.format ?? 'f32',
      exclude: (s) => placement.exclude(s),
      deadlineMs: (tokens) => deadlineMs(predictedSeconds(placement.plan, tokens, planTokens), deadlineFloorMs),
      recover: (cause, attempt, progress) => recovery.recover(cause, attempt, { progress }),
      recovered: (replayed) => recovery.recovered(replayed),
    }, randomUUID());
  }

  /** One step of a session through the job: the user's first end, the workers (every result checked), the user's last end. */
  private stepModel(steps: SessionSteps, passes = false): StepModel {
    const { source } = this.ctx.placement;
    const keepEnds = this.ctx.keepEnds;
    return {
      maxPositions: source.config.maxPositions,
      eosTokenId: source.tokenizer?.eosTokenId ?? source.config.eosTokenId ?? null,
      step: async (ids, opts) => {
        const positions = opts.positions!;
        const keyMask = opts.keyMask ?? null;
        const x = await steps.run(keepEnds ? this.runEnd('first', ids, positions) : ids, positions, keyMask, passes);
        return keepEnds ? this.runEnd('last', x, positions) : x;
      },
    };
  }

  /**
   * Runs a session and has its sampled records re-run before it closes (the workers keep a
   * session's inputs until then). When a worker is caught, its results may have steered the
   * session: the job is planned again on trusted workers and the session run again.
   */
  private async session<T>(run: (session: SessionSteps) => Promise<T>, steps: (result: T) => number): Promise<T> {
    const { placement, recovery, replanner, verifier } = this.ctx;
    await this.ctx.settle();
    // between sessions the job may move to a better plan: nothing is lost, the sections load where they go
    const reason = this.ctx.trains() ? null : await replanner.betterPlan();
    if (reason) {
      verifier?.discardSampled();
      await placement.replan(await recovery.recentlyLost());
      replanner.moved(reason);
    }
    for (;;) {
      const session = this.newSession();
      let result: T;
      let failed: AuditVerdict[];
      try {
        result = await run(session);
        session.settle();
        failed = (await verifier?.auditSampled()) ?? [];
      } catch (err) {
        // a session that failed leaves nothing to re-run: its workers drop it as it closes
        verifier?.discardSampled();
        throw err;
      } finally {
        // every id the session had on the workers (a failover starts a new one on the new route)
        await Promise.all(placement.all.flatMap((s) => session.sessionIds.map((id) => s.remote.closeSession(id).catch(() => {}))));
      }
      if (failed.length === 0) return result;
      if (this.ctx.trains() && placement.canReplan) {
        // the caught worker's steps trained the job too: it is rolled back and replayed without it, and the session, its
        // result discarded, run again on the job as an honest swarm holds it
        await this.ctx.caught(failed);
        verifier!.summary.replayedSteps += steps(result);
        continue;
      }
      if (this.ctx.trains() || !placement.canReplan) {
        throw new VerificationError(`${failed.map((f) => f.peer).join(', ')} failed re-execution of a decoding step; the result was discarded`, {
          details: { flagged: failed.map((f) => f.peer) },
        });
      }
      await placement.replan();
      verifier!.summary.replayedSteps += steps(result);
    }
  }
}
