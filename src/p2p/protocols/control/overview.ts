import { fail, finite, int, list, obj, oneOf, optional, peerIdText, str } from '../../schema.ts';
import { type PeerRecord, parseJobId, parsePeerRecord, VOCABULARY_LIMITS } from '../../vocabulary.ts';
import { type HostedModelEntry, parseModelsAnswer } from './schema.ts';

/**
 * What the dashboard shows, as the validator keeps it: users report their jobs' progress
 * (`job-progress`), and anyone may ask for the whole picture (`overview`).
 *
 *   job-progress  {jobId, kind, state, model?, stages, step, loss?, tokens, tokensPerSecond, stageSeconds} → ack
 *   overview      {}  → overview {validator, uptimeMs, peers, jobs, events, ledger, models}
 *
 * A report is untrusted input from a user: it is parsed, bounded (OVERVIEW_LIMITS) and shown
 * under its sender's peer id; it is never used to pay anyone.
 */

export const OVERVIEW_LIMITS = {
  /** Jobs the validator keeps at once: a dashboard of more is unreadable (the answer's size is bounded by jobsBytes too). */
  jobs: 64,
  /** Jobs one user may have on show: a few runs side by side, not a flood that pushes the others off. */
  jobsPerPeer: 8,
  /** Points kept of one job's history (loss and tokens/s per step): enough for a plot, ~20 kB per job. */
  history: 200,
  /** Sections of a job on show: more than any plan here makes, and a report stays a few kB. */
  stages: 64,
  /** Workers named per section (its replicas or redundant copies). */
  peersPerStage: 16,
  /** Bytes of the jobs in one overview answer: the oldest-heard jobs are left out beyond it, so the answer fits a control frame. */
  jobsBytes: 512 * 1024,
  /** Verification and membership events kept: the recent past, newest first. */
  events: 200,
  /** Blocks of the ledger listed (the newest). */
  blocks: 12,
  /** Characters of a model's name in a report. */
  name: 128,
  /** Hosted models on show (the first of the index, in name order): `tensorlink models` pages through them all. */
  models: 32,
  /** Hosts listed per hosted model on show: its coverage is computed over all of them by the validator. */
  hostsPerModel: 16,
} as const;

/** A job as its user reports it after each step (training) or call (generation). */
export interface JobProgress {
  jobId: string;
  /** 'rl': training by reinforcement (GRPO), with the rollouts' reward beside the loss. */
  kind: 'train' | 'generate' | 'rl';
  state: 'running' | 'closed';
  model?: string;
  /** The plan: which workers hold which layers (one entry per section, its replicas or redundant copies together). */
  stages: { start: number; end: number; peers: string[] }[];
  /** Training steps done, or generation calls answered. */
  step: number;
  /** The last training step's loss. */
  loss?: number;
  /** Reinforcement learning: the last step's mean reward of its rollouts, and the last held-out accuracy (0–1). */
  reward?: number;
  accuracy?: number;
  /** Reinforcement learning with a KL term: the last rollouts' KL to the reference (k3, the mean over their tokens). */
  kl?: number;
  /** Reinforcement learning: the last rollouts' tokens a second of their generation. */
  rolloutTokensPerSecond?: number;
  /** Tokens processed so far (trained on, or generated). */
  tokens: number;
  /** Over the last step or call. */
  tokensPerSecond: number;
  /** Seconds each section spent on the last step (compute and transfer, its slowest copy). */
  stageSeconds: number[];
}

/** One point of a job's history. */
export interface JobPoint {
  step: number;
  at: number;
  loss?: number;
  reward?: number;
  tokensPerSecond: number;
}

/** A job on the dashboard: the user's last report, who sent it, and its history. */
export interface JobView extends JobProgress {
  owner: string;
  startedAt: number;
  updatedAt: number;
  history: JobPoint[];
}

export type OverviewEventKind = 'joined' | 'left' | 'check-passed' | 'check-failed' | 'slashed';

export interface OverviewEvent {
  at: number;
  kind: OverviewEventKind;
  peer: string;
  detail: string;
}

export interface LedgerSummary {
  height: number;
  records: number;
  pending: number;
  hash: string;
  blocks: { height: number; count: number; time: number; signers: number }[];
  /** Each worker's accepted records and their FLOPs. */
  work: Record<string, { records: number; flops: number }>;
}

export interface Overview {
  validator: string;
  uptimeMs: number;
  peers: PeerRecord[];
  jobs: JobView[];
  events: OverviewEvent[];
  ledger: LedgerSummary;
  /** The hosted models (the first OVERVIEW_LIMITS.models of the index): coverage, hosts, their formats, states and sessions. */
  models?: HostedModelEntry[];
}

const EVENT_KINDS: readonly OverviewEventKind[] = ['joined', 'left', 'check-passed', 'check-failed', 'slashed'];

export function parseJobProgress(v: unknown): JobProgress {
  const m = obj(v, 'job-progress');
  const stages = list(m.stages, 'job-progress.stages', OVERVIEW_LIMITS.stages, (s, what) => {
    const o = obj(s, what);
    const start = int(o.start, `${what}.start`, 0, VOCABULARY_LIMITS.layers);
    const end = int(o.end, `${what}.end`, start + 1, VOCABULARY_LIMITS.layers);
    return { start, end, peers: list(o.peers, `${what}.peers`, OVERVIEW_LIMITS.peersPerStage, (p, w) => peerIdText(p, w)) };
  });
  const loss = optional(m.loss, (x) => finite(x, 'job-progress.loss', -1e9, 1e9));
  const reward = optional(m.reward, (x) => finite(x, 'job-progress.reward', -1e9, 1e9));
  const accuracy = optional(m.accuracy, (x) => finite(x, 'job-progress.accuracy', 0, 1));
  const kl = optional(m.kl, (x) => finite(x, 'job-progress.kl', 0, 1e9));
  const rollouts = optional(m.rolloutTokensPerSecond, (x) => finite(x, 'job-progress.rolloutTokensPerSecond', 0, 1e12));
  const model = optional(m.model, (x) => str(x, 'job-progress.model', OVERVIEW_LIMITS.name));
  return {
    jobId: parseJobId(m.jobId),
    kind: oneOf(m.kind, 'job-progress.kind', ['train', 'generate', 'rl'] as const),
    state: oneOf(m.state, 'job-progress.state', ['running', 'closed'] as const),
    ...(model === undefined ? {} : { model }),
    stages,
    step: int(m.step, 'job-progress.step'),
    ...(loss === undefined ? {} : { loss }),
    ...(reward === undefined ? {} : { reward }),
    ...(accuracy === undefined ? {} : { accuracy }),
    ...(kl === undefined ? {} : { kl }),
    ...(rollouts === undefined ? {} : { rolloutTokensPerSecond: rollouts }),
    tokens: int(m.tokens, 'job-progress.tokens'),
    tokensPerSecond: finite(m.tokensPerSecond, 'job-progress.tokensPerSecond', 0, 1e12),
    stageSeconds: list(m.stageSeconds, 'job-progress.stageSeconds', OVERVIEW_LIMITS.stages, (x, w) => finite(x, w, 0, 1e9)),
  };
}

function parseJobView(v: unknown, what: string): JobView {
  const o = obj(v, what);
  return {
    ...parseJobProgress(o),
    owner: peerIdText(o.owner, `${what}.owner`),
    startedAt: finite(o.startedAt, `${what}.startedAt`),
    updatedAt: finite(o.updatedAt, `${what}.updatedAt`),
    history: list(o.history, `${what}.history`, OVERVIEW_LIMITS.history, (p, w) => {
      const q = obj(p, w);
      const loss = optional(q.loss, (x) => finite(x, `${w}.loss`, -1e9, 1e9));
      const reward = optional(q.reward, (x) => finite(x, `${w}.reward`, -1e9, 1e9));
      return {
        step: int(q.step, `${w}.step`), at: finite(q.at, `${w}.at`), ...(loss === undefined ? {} : { loss }),
        ...(reward === undefined ? {} : { reward }),
        tokensPerSecond: finite(q.tokensPerSecond, `${w}.tokensPerSecond`, 0, 1e12),
      };
    }),
  };
}

/** A validator's overview answer (from a peer: every field checked). */
export function parseOverview(m: Record<string, unknown>): Overview {
  if (m.type !== 'overview') fail(`expected an overview answer, got '${String(m.type)}'`);
  const l = obj(m.ledger, 'overview.ledger');
  const work: LedgerSummary['work'] = {};
  for (const [peer, w] of Object.entries(obj(l.work ?? {}, 'overview.ledger.work')).slice(0, VOCABULARY_LIMITS.proximity)) {
    const o = obj(w, `overview.ledger.work[${peer}]`);
    work[peerIdText(peer, 'overview.ledger.work')] = { records: int(o.records, 'work.records'), flops: finite(o.flops, 'work.flops') };
  }
  return {
    validator: peerIdText(m.validator, 'overview.validator'),
    uptimeMs: finite(m.uptimeMs, 'overview.uptimeMs'),
    peers: list(m.peers, 'overview.peers', VOCABULARY_LIMITS.proximity, (p, w) => parsePeerRecord(p, w)),
    jobs: list(m.jobs, 'overview.jobs', OVERVIEW_LIMITS.jobs, parseJobView),
    events: list(m.events, 'overview.events', OVERVIEW_LIMITS.events, (e, w) => {
      const o = obj(e, w);
      return {
        at: finite(o.at, `${w}.at`), kind: oneOf(o.kind, `${w}.kind`, EVENT_KINDS),
        peer: peerIdText(o.peer, `${w}.peer`), detail: str(o.detail, `${w}.detail`, 512),
      };
    }),
    ledger: {
      height: int(l.height, 'ledger.height'),
      records: int(l.records, 'ledger.records'),
      pending: int(l.pending, 'ledger.pending'),
      hash: str(l.hash, 'ledger.hash', 128),
      blocks: list(l.blocks, 'ledger.blocks', OVERVIEW_LIMITS.blocks, (b, w) => {
        const o = obj(b, w);
        return { height: int(o.height, `${w}.height`), count: int(o.count, `${w}.count`), time: finite(o.time, `${w}.time`), signers: int(o.signers, `${w}.signers`) };
      }),
      work,
    },
    // an older validator sends no models
    ...(m.models === undefined ? {} : { models: parseOverviewModels(m.models) }),
  };
}

/** The hosted models of an overview: the index's own parser, within the overview's bounds. */
function parseOverviewModels(v: unknown): HostedModelEntry[] {
  const models = list(v, 'overview.models', OVERVIEW_LIMITS.models, (e, w) => {
    const o = obj(e, w);
    list(o.hosts, `${w}.hosts`, OVERVIEW_LIMITS.hostsPerModel, (h) => h);
    return o;
  });
  return parseModelsAnswer({ type: 'models', models }).models;
}
