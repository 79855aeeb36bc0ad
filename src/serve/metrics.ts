import type { Overview } from '../user/index.ts';
import type { KVStats } from './continuous.ts';
import type { SpeculativeCounts } from './speculative.ts';

/** What an API server has served since it started (GET /metrics, and the dashboard's serving panel). */
export interface ServingStats {
  model: string;
  /** Answered requests by HTTP status code. */
  requests: Record<string, number>;
  promptTokens: number;
  completionTokens: number;
  /** Requests waiting for the model (not yet in a batch). */
  waiting: number;
  /** Streamed requests' time to their first token: seconds summed, and how many. */
  firstToken: { seconds: number; count: number };
  /** Tokens generated per second over the last minute. */
  tokensPerSecond: number;
  /** A model served from this process: its paged KV cache and shared prefixes. */
  kv?: KVStats;
  /** Lone rows decoded speculatively across workers or hosts (`serve --speculative`, `--draft`). */
  speculative?: SpeculativeCounts;
}

/** The dashboard's whole state at one moment: the swarm (null: none, or the validator could not be asked) and what this process serves. */
export interface DashboardState {
  at: number;
  overview: Overview | null;
  serving: ServingStats | null;
  /** Why the swarm is missing when it should be there (the validator did not answer). */
  error?: string;
}

type Labels = Record<string, string | number>;

/** One metric family in Prometheus' text exposition format (version 0.0.4). */
class Family {
  readonly lines: string[] = [];
  constructor(readonly name: string, readonly type: 'gauge' | 'counter' | 'summary', readonly help: string) {}

  add(value: number, labels: Labels = {}, suffix = ''): this {
    if (!Number.isFinite(value)) return this;
    const keys = Object.keys(labels);
    const text = keys.length === 0 ? '' : `{${keys.map((k) => `${k}="${escape(String(labels[k]))}"`).join(',')}}`;
    this.lines.push(`${this.name}${suffix}${text} ${value}`);
    return this;
  }

  toString(): string {
    return [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} ${this.type}`, ...this.lines].join('\n');
  }
}

function escape(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/** Token amounts are decimal strings of 18-decimal units: as a float of whole tokens for a gauge. */
function tokens(units: string | undefined): number {
  return units === undefined ? Number.NaN : Number(BigInt(units) / 10n ** 12n) / 1e6;
}

/**
 * The dashboard's figures in Prometheus' text format: peers, reputation and checks, links,
 * jobs (step, loss, tokens/s, per-stage seconds), the ledger, stake and rewards, and what this
 * process serves. A pure function of the state, so a scrape shows what the page shows.
 */
export function metricsText(state: DashboardState): string {
  const families: Family[] = [];
  const family = (name: string, type: 'gauge' | 'counter' | 'summary', help: string) => {
    const f = new Family(`tensorlink_${name}`, type, help);
    families.push(f);
    return f;
  };
  const o = state.overview;
  if (o) {
    family('uptime_seconds', 'gauge', 'Seconds since the validator started.').add(o.uptimeMs / 1000);
    const roles = new Map<string, number>();
    for (const p of o.peers) for (const r of p.roles) roles.set(r, (roles.get(r) ?? 0) + 1);
    const peers = family('peers', 'gauge', 'Live peers the validator knows, by role.');
    for (const [role, n] of roles) peers.add(n, { role });
    const workers = o.peers.filter((p) => p.roles.includes('worker'));
    const gflops = family('worker_gflops', 'gauge', 'Measured matrix-product speed of a worker.');
    const memory = family('worker_memory_bytes', 'gauge', 'Memory a worker offers for model sections.');
    const free = family('worker_memory_free_bytes', 'gauge', 'Of that, what its jobs do not hold.');
    const reputation = family('worker_reputation', 'gauge', 'A worker\'s score: moving average of its checks (1 passed, 0 failed).');
    const checks = family('worker_checks_total', 'counter', 'Re-executions of a worker\'s records by the validator, by result.');
    const excluded = family('worker_excluded', 'gauge', '1 when a failed check flagged the worker.');
    const stake = family('worker_stake_tokens', 'gauge', 'A worker\'s stake on the chain, in TLK.');
    const earned = family('worker_earned_tokens', 'gauge', 'Rewards a worker earned, in TLK.');
    const work = family('worker_ledger_flops', 'counter', 'FLOPs of a worker\'s records accepted in the ledger.');
    for (const p of workers) {
      const l = { peer: p.peerId };
      if (p.capabilities) {
        gflops.add(p.capabilities.gflops, { ...l, tier: p.capabilities.tier, backend: p.capabilities.backend });
        memory.add(p.capabilities.memoryBytes, l);
        free.add(p.capabilities.memoryFreeBytes ?? p.capabilities.memoryBytes, l);
      }
      if (p.reputation !== undefined) reputation.add(p.reputation, l);
      if (p.checks) checks.add(p.checks.passed, { ...l, result: 'passed' }).add(p.checks.failed, { ...l, result: 'failed' });
      excluded.add(p.excluded ? 1 : 0, l);
      stake.add(tokens(p.stake), l);
      earned.add(tokens(p.earned), l);
      work.add(o.ledger.work[p.peerId]?.flops ?? 0, l);
    }
    const rtt = family('link_rtt_seconds', 'gauge', 'Round-trip time from one peer to another, as last measured.');
    const mbps = family('link_mbps', 'gauge', 'Bandwidth from one peer to another, as last measured.');
    for (const p of o.peers) {
      for (const [to, link] of Object.entries(p.proximity)) {
        rtt.add(link.rttMs / 1000, { from: p.peerId, to });
        mbps.add(link.mbps, { from: p.peerId, to });
      }
    }
    const step = family('job_step', 'gauge', 'Training steps done (or generation calls answered) of a job, as its user reports.');
    const loss = family('job_loss', 'gauge', 'The last training step\'s loss of a job.');
    const speed = family('job_tokens_per_second', 'gauge', 'Tokens per second of a job\'s last step or call.');
    const done = family('job_tokens_total', 'counter', 'Tokens a job has processed.');
    const stage = family('job_stage_seconds', 'gauge', 'Seconds a section of a job spent on its last step.');
    for (const j of o.jobs) {
      // job_id, not job: Prometheus keeps `job` for its scrape target; owner: ids are the users' own, so two may share one
      const l = { job_id: j.jobId, owner: j.owner, kind: j.kind, state: j.state };
      step.add(j.step, l);
      if (j.loss !== undefined) loss.add(j.loss, l);
      speed.add(j.tokensPerSecond, l);
      done.add(j.tokens, l);
      j.stageSeconds.forEach((s, i) => stage.add(s, { job_id: j.jobId, owner: j.owner, stage: i }));
    }
    family('ledger_height', 'gauge', 'Blocks in the validator\'s ledger.').add(o.ledger.height);
    family('ledger_records', 'gauge', 'Records in the ledger\'s blocks.').add(o.ledger.records);
    family('ledger_pending_records', 'gauge', 'Records waiting for the next block.').add(o.ledger.pending);
    const failed = o.events.filter((e) => e.kind === 'check-failed').length;
    family('recent_failed_checks', 'gauge', 'Failed checks among the validator\'s recent events.').add(failed);
  }
  const s = state.serving;
  if (s) {
    const requests = family('serve_requests_total', 'counter', 'OpenAI API requests (/v1/...) answered, by status code.');
    for (const [code, n] of Object.entries(s.requests)) requests.add(n, { code, model: s.model });
    family('serve_prompt_tokens_total', 'counter', 'Prompt tokens of answered requests.').add(s.promptTokens, { model: s.model });
    family('serve_completion_tokens_total', 'counter', 'Tokens generated for requests.').add(s.completionTokens, { model: s.model });
    family('serve_waiting_requests', 'gauge', 'Requests waiting for the model.').add(s.waiting, { model: s.model });
    family('serve_tokens_per_second', 'gauge', 'Tokens generated per second over the last minute.').add(s.tokensPerSecond, { model: s.model });
    family('serve_time_to_first_token_seconds', 'summary', 'Time from a streamed request to its first token.')
      .add(s.firstToken.seconds, { model: s.model }, '_sum').add(s.firstToken.count, { model: s.model }, '_count');
    if (s.kv) {
      family('serve_kv_cache_bytes', 'gauge', 'Bytes of the KV cache\'s pages alive (live rows and kept prefixes).').add(s.kv.bytes, { model: s.model });
      family('serve_kv_shared_pages', 'gauge', 'Kept prefix pages that a live row holds.').add(s.kv.sharedPages, { model: s.model });
      family('serve_prefix_positions_total', 'counter', 'Prompt positions found in a kept prefix (hit) or computed (miss).')
        .add(s.kv.hits, { model: s.model, result: 'hit' }).add(s.kv.misses, { model: s.model, result: 'miss' });
    }
    const sp = s.speculative;
    if (sp) {
      family('serve_speculative_passes_total', 'counter', 'Trips through the model of speculative generations (one per token without).')
        .add(sp.passes, { model: s.model });
      family('serve_speculative_tokens_total', 'counter', 'Tokens of speculative generations.').add(sp.tokens, { model: s.model });
      family('serve_speculative_drafts_total', 'counter', 'Drafted tokens checked, by whether the model kept them.')
        .add(sp.accepted, { model: s.model, result: 'accepted' }).add(sp.drafted - sp.accepted, { model: s.model, result: 'rejected' });
    }
  }
  return `${families.filter((f) => f.lines.length > 0).map(String).join('\n')}\n`;
}
