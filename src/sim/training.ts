/**
 * Private training jobs in the simulation: placed by the project's own planner (layer-aware, over every eligible live
 * worker, each announced with its free memory and speed; links from the world's round trips and bandwidths), run
 * step by step in virtual time, re-placed around a worker that leaves or is caught (as failover re-plans), and their
 * records sampled for re-execution at the default rate.
 */
import { PlanInfeasibleError } from '../errors.ts';
import { llamaConfig, modelLayers } from '../models/index.ts';
import type { PeerRecord } from '../p2p/index.ts';
import { evaluatePlan, layerCosts, type LayerCost, type Links, plan, type Plan, stepSeconds } from '../plan/index.ts';
import { jobPlanOptions, memoryFactor, surveyWorkers } from '../user/survey.ts';
import { MAX_FAILOVERS } from '../user/failover.ts';
import { DEFAULT_SAMPLE_RATE } from '../user/verifier.ts';
import type { SimContext } from './context.ts';
import { SAVED } from './hosted.ts';
import type { SimPeer, SimUser } from './population.ts';
import { mbps, type Place, rttMs } from './world.ts';

/** The jobs' model: a 24-block Llama of about 400M parameters, its layers' costs read from the project's own profile. */
let costs: LayerCost[] | null = null;
export function jobLayers(): LayerCost[] {
  const config = llamaConfig({ vocabSize: 32000, hidden: 1024, layers: 24, heads: 16, kvHeads: 8, intermediate: 2816, maxPositions: 2048 });
  costs ??= layerCosts(modelLayers(config));
  return costs;
}
/** A training step's tokens (8 sequences of 256), its micro-batches, and the records each stage signs per step. */
const STEP_TOKENS = 2048;
const MICRO_BATCHES = 4;
const RECORDS_PER_STEP = 2 * MICRO_BATCHES + 1;
/** Memory a stage needs per byte of its weights: weights, gradients, AdamW's two moments, and a verified job's copies. */
const TRAIN_MEMORY_FACTOR = memoryFactor(true, DEFAULT_SAMPLE_RATE > 0);
/** How long a lost worker takes to be noticed, and a new section to load (besides its bytes over the user's link). */
const LOSS_DETECT_MS = 10_000;
const CHECK_MS = 5_000;

export interface JobOutcome {
  ok: boolean;
  cause?: 'infeasible' | 'failovers-exhausted';
  steps: number;
  failovers: number;
  /** Wall-clock milliseconds each placement took (the real planner over this many devices). */
  placements: { ms: number; devices: number }[];
}

/**
 * A training job's plan over the registry's records, as distribute makes it (src/user/survey.ts): the fastest candidates,
 * each offering its free memory, the model's layers at the memory a verified training job holds per byte of weights, the
 * user's hops charged; `layers` are the layers the workers take (the user keeps the ends), at their weights' bytes.
 */
export function placeTraining(
  records: readonly PeerRecord[], layers: readonly LayerCost[], user: string, links: Links, counted: (devices: number) => void = () => {},
  inputBytesPerToken = layers[0]?.activationBytesPerToken ?? 4,
): { plan: Plan; timed: Plan } {
  const { devices } = surveyWorkers(records, layers.length, 1);
  counted(devices.length);
  const costs = layers.map((l) => ({ ...l, bytes: l.bytes * TRAIN_MEMORY_FACTOR }));
  const options = { ...jobPlanOptions({ user, inputBytesPerToken, training: true }), links };
  const made = plan('layer-aware', costs, devices, options);
  // the plan is chosen as distribute chooses it; its steps last what a step of STEP_TOKENS in MICRO_BATCHES takes on it
  const timed = evaluatePlan(made, costs, devices, { ...options, tokens: STEP_TOKENS, microBatches: MICRO_BATCHES }) ?? made;
  return { plan: made, timed };
}

/** Links between simulated nodes by id, as the planner takes them (bytes/s, one-way seconds). */
function linksOf(placeOf: (id: string) => Place | undefined, ctx: SimContext): Links {
  return {
    bandwidth: (a, b) => {
      const [x, y] = [placeOf(a), placeOf(b)];
      return x && y ? (mbps(x, y, ctx.relay) * 1e6) / 8 : undefined;
    },
    latency: (a, b) => {
      const [x, y] = [placeOf(a), placeOf(b)];
      return x && y ? rttMs(x, y, ctx.relay) / 2000 : undefined;
    },
  };
}

/**
 * One job of `steps` steps for `user`. Workers that hold a section are busy for it; a worker lost (gone offline or
 * caught) makes the job re-plan around it and every worker that failed it, up to MAX_FAILOVERS times. A caught cheater
 * sends the job back to its start (the project keeps no verified checkpoint in between).
 */
export function runJob(
  ctx: SimContext, user: SimUser, steps: number, done: (o: JobOutcome) => void,
  placed: (p: { ms: number; devices: number }) => void = () => {},
): void {
  // the layers workers take: the model's blocks (the user keeps the embedding, the final norm and the head)
  const all = jobLayers();
  const layers = all.slice(1, all.length - 2);
  const avoid = new Set<string>();
  const placements: JobOutcome['placements'] = [];
  const placeOf = (id: string) => (id === user.id ? user.place : ctx.byId.get(id)?.place);
  let failovers = 0;
  let step = 0;
  let held: SimPeer[] = [];
  const release = () => {
    for (const p of held) p.job = null;
    held = [];
  };
  const finish = (o: Omit<JobOutcome, 'placements' | 'failovers'>) => {
    release();
    done({ ...o, failovers, placements });
  };
  const place = (): { plan: Plan; timed: Plan } | null => {
    // every live worker the validator lists that is free, not excluded, and not avoided: the planner reads them all
    const free = ctx.view.live.filter((r) => {
      const p = ctx.byId.get(r.peerId);
      return p !== undefined && p.online && !p.excluded && p.job === null && p.span === null && !avoid.has(p.id);
    });
    const t0 = performance.now();
    let devices = 0;
    try {
      const made = placeTraining(free, layers, user.id, linksOf(placeOf, ctx), (n) => (devices = n), all[0].activationBytesPerToken);
      placements.push({ ms: performance.now() - t0, devices });
      placed(placements.at(-1)!);
      return made;
    } catch (err) {
      placements.push({ ms: performance.now() - t0, devices });
      placed(placements.at(-1)!);
      if (err instanceof PlanInfeasibleError) return null;
      throw err;
    }
  };
  const run = () => {
    const chosen = place();
    if (chosen === null) return finish({ ok: false, cause: 'infeasible', steps: step });
    const made = chosen.timed;
    held = made.stages.map((s) => ctx.byId.get(s.device)!);
    for (const p of held) p.job = 1;
    // loading: each section's weights from the user over its link
    const loadSeconds = (s: Plan['stages'][number]) => ((s.bytes / TRAIN_MEMORY_FACTOR) * 8) / (mbps(user.place, placeOf(s.device)!, ctx.relay) * 1e6);
    const loadMs = 1000 * Math.max(...made.stages.map(loadSeconds));
    const stepMs = stepSeconds(made, MICRO_BATCHES) * 1000;
    const start = ctx.clock.now() + loadMs;
    const endAt = start + (steps - step) * stepMs;
    // the first loss: a worker going offline, or a cheater's first sampled record failing its re-run
    let lost: { at: number; peer: SimPeer; caught: boolean } | null = null;
    for (const p of held) {
      if (p.nextChange < endAt && (lost === null || p.nextChange < lost.at)) lost = { at: p.nextChange, peer: p, caught: false };
      if (p.cheat !== null) {
        // each step's records are sampled one by one: the step of the first one picked
        let k = 0;
        while (step + k < steps && !sampledStep(ctx)) k++;
        const at = start + (k + 1) * stepMs + CHECK_MS;
        if (step + k < steps && (lost === null || at < lost.at)) lost = { at, peer: p, caught: true };
      }
    }
    const account = (from: number, to: number, at: number) => {
      for (const s of made.stages) {
        const flops = 6 * s.params * STEP_TOKENS * (to - from);
        ctx.work.push({ peer: s.device, job: `job-${user.id}-${placements.length}`, user: user.id, flops, at });
        const p = ctx.byId.get(s.device)!;
        if (p.cheat !== null) ctx.skippedFlops.set(p.id, (ctx.skippedFlops.get(p.id) ?? 0) + flops * SAVED[p.cheat]);
        ctx.requests.check = (ctx.requests.check ?? 0) + Math.round((to - from) * RECORDS_PER_STEP * DEFAULT_SAMPLE_RATE);
      }
    };
    if (lost === null) {
      ctx.clock.at(endAt, () => {
        account(step, steps, endAt);
        finish({ ok: true, steps });
      });
      return;
    }
    const loss = lost;
    ctx.clock.at(loss.at, () => {
      const reached = Math.max(step, Math.min(steps, step + Math.floor((loss.at - start) / stepMs)));
      account(step, reached, loss.at);
      // a cheater caught: flagged, and the job replays from its start on honest workers
      if (loss.caught) {
        ctx.flag(loss.peer, `a re-run of its ${loss.peer.cheat} record`);
        step = 0;
      } else step = reached;
      avoid.add(loss.peer.id);
      release();
      if (++failovers > MAX_FAILOVERS) return finish({ ok: false, cause: 'failovers-exhausted', steps: step });
      ctx.clock.after(LOSS_DETECT_MS, run);
    });
  };
  run();
}

/** Whether any of a step's records is sampled for re-execution. */
function sampledStep(ctx: SimContext): boolean {
  for (let r = 0; r < RECORDS_PER_STEP; r++) if (ctx.rng.checks.next() < DEFAULT_SAMPLE_RATE) return true;
  return false;
}
