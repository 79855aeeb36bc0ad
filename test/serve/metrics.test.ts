import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { type JobProgress, OVERVIEW_LIMITS, type Overview, parseJobProgress, parseOverview } from '../../src/p2p/index.ts';
import { metricsText } from '../../src/serve/index.ts';
import { EventLog, JOB_CLOSED_MS, JOB_SILENT_MS, JobBoard, PASSED_EVENTS } from '../../src/validator/index.ts';

const A = '12D3KooWGzBz8CmdMeZP7ZJ1ZGeAH6oGHbFJzJYjM7bQ2KkbZbJj';
const B = '12D3KooWRqbmh6gJ7zHYvHYprCxkiNfHWeJdUH8tP9wKeGDqzN3m';

const progress = (step: number, o: Partial<JobProgress> = {}): JobProgress => ({
  jobId: 'job-1', kind: 'train', state: 'running', stages: [{ start: 1, end: 3, peers: [A] }, { start: 3, end: 5, peers: [B] }],
  step, loss: 5 - step / 100, tokens: step * 64, tokensPerSecond: 100 + step, stageSeconds: [0.02, 0.03], ...o,
});

describe('the validator\'s job board and event log (pure)', () => {
  test('reports become a job with its history; the board is bounded per user and in all; silent and closed jobs leave', () => {
    const board = new JobBoard();
    for (let s = 1; s <= 5; s++) board.report(A, progress(s), 1000 + s);
    board.report(A, progress(5), 1010); // the same step again: no new point
    const [job] = board.list(1010);
    assert.deepEqual(job.history.map((p) => p.step), [1, 2, 3, 4, 5]);
    assert.equal(job.owner, A);
    assert.equal(job.startedAt, 1001);

    // the same job id from another peer is another job: a user cannot overwrite someone else's
    board.report(B, progress(1), 1020);
    assert.equal(board.list(1020).length, 2);

    for (let i = 2; i <= OVERVIEW_LIMITS.jobsPerPeer; i++) board.report(A, progress(1, { jobId: `job-${i}` }), 1030);
    assert.throws(() => board.report(A, progress(1, { jobId: 'one-too-many' }), 1031), { name: 'RateLimitedError' });
    // a closed job of the same user makes room for a new one
    board.report(A, progress(2, { jobId: 'job-2', state: 'closed' }), 1032);
    board.report(A, progress(1, { jobId: 'next' }), 1033);
    assert.ok(board.list(1033).some((j) => j.jobId === 'next') && !board.list(1033).some((j) => j.jobId === 'job-2'));

    // a long run keeps its whole shape in at most OVERVIEW_LIMITS.history points, first and last kept
    const long = new JobBoard();
    for (let s = 1; s <= 5000; s++) long.report(A, progress(s), s);
    const h = long.list(5000)[0].history;
    assert.ok(h.length <= OVERVIEW_LIMITS.history, `${h.length} points`);
    assert.equal(h[0].step, 1);
    assert.equal(h.at(-1)!.step, 5000);
    assert.ok(h.every((p, i) => i === 0 || p.step > h[i - 1].step));

    assert.equal(long.list(5000 + JOB_SILENT_MS + 1).length, 0, 'a silent job leaves');
    long.report(A, progress(1, { state: 'closed' }), 0);
    assert.equal(long.list(JOB_SILENT_MS + 1).length, 1, 'a closed one stays a while');
    assert.equal(long.list(JOB_CLOSED_MS + 1).length, 0);
  });

  test('events: newest first, bounded; passed checks never push a failure off the list', () => {
    const log = new EventLog();
    log.add('check-failed', A, 'caught', 0);
    for (let i = 1; i <= 1000; i++) log.add('check-passed', B, `n${i}`, i);
    const events = log.list();
    assert.equal(events.length, PASSED_EVENTS + 1);
    assert.equal(events[0].detail, 'n1000');
    assert.equal(events.at(-1)!.kind, 'check-failed');
    // nor do joins and leaves (made-up peers announcing)
    for (let i = 0; i < OVERVIEW_LIMITS.events * 2; i++) log.add('joined', A, `j${i}`, 2000 + i);
    assert.ok(log.list().some((e) => e.kind === 'check-failed'));
    for (let i = 0; i < OVERVIEW_LIMITS.events * 2; i++) log.add('slashed', A, `s${i}`, 9000 + i);
    assert.equal(log.list().length, OVERVIEW_LIMITS.events);
  });

  test('a malformed report is a typed error that names the field', () => {
    const bad: unknown[] = [
      null, { ...progress(1), jobId: '../etc' }, { ...progress(1), kind: 'mine' }, { ...progress(1), step: -1 }, { ...progress(1), loss: 'low' },
      { ...progress(1), stages: [{ start: 3, end: 3, peers: [] }] }, { ...progress(1), stages: [{ start: 0, end: 1, peers: ['not-a-peer'] }] },
      { ...progress(1), tokensPerSecond: Number.POSITIVE_INFINITY }, { ...progress(1), model: 'x'.repeat(1000) },
      { ...progress(1), stageSeconds: Array(2000).fill(1) }, { ...progress(1), stages: Array(65).fill({ start: 0, end: 1, peers: [A] }) },
    ];
    for (const m of bad) assert.throws(() => parseJobProgress(m), { name: 'InvalidMessageError' }, JSON.stringify(m)?.slice(0, 80));
    assert.deepEqual(parseJobProgress({ ...progress(2), extra: 'ignored' }), progress(2));
  });
});

describe('/metrics: Prometheus\' text format', () => {
  const board = new JobBoard();
  board.report(A, progress(7), 1);
  const overview: Overview = {
    validator: B, uptimeMs: 12_000, jobs: board.list(1), events: [{ at: 1, kind: 'check-failed', peer: A, detail: 'forward of step 1' }],
    peers: [
      { peerId: B, roles: ['validator'], capabilities: null, addrs: [], proximity: {}, lastSeen: 1 },
      {
        peerId: A, roles: ['worker'], addrs: [], lastSeen: 1, reputation: 0.25, checks: { passed: 3, failed: 1 }, excluded: true,
        capabilities: { memoryBytes: 2 ** 30, memoryFreeBytes: 2 ** 29, gflops: 150, tier: 'C', cores: 2, backend: 'ort' },
        proximity: { [B]: { rttMs: 1.5, mbps: 900, measuredAt: 1 } }, stake: '50000000000000000000', earned: '1500000000000000000',
      },
    ],
    ledger: { height: 2, records: 30, pending: 4, hash: 'ab', blocks: [{ height: 1, count: 15, time: 1, signers: 1 }], work: { [A]: { records: 30, flops: 1e9 } } },
  };

  test('every family has HELP and TYPE, every sample parses, and the figures are the overview\'s', () => {
    const text = metricsText({ at: 1, overview: parseOverview({ type: 'overview', ...JSON.parse(JSON.stringify(overview)) }), serving: null });
    const lines = text.trimEnd().split('\n');
    const sample = /^([a-z_]+)(\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\})? (-?\d+(\.\d+)?(e[+-]?\d+)?)$/;
    const declared = new Set<string>();
    for (const line of lines) {
      const m = /^# TYPE (\S+) (gauge|counter|summary)$/.exec(line);
      if (m) declared.add(m[1]);
      else if (!line.startsWith('# HELP ')) {
        assert.match(line, sample);
        assert.ok([...declared].some((name) => line.startsWith(name)), `${line} comes after its TYPE`);
      }
    }
    const value = (series: string) => Number(lines.find((l) => l.startsWith(`${series} `))?.split(' ')[1]);
    assert.equal(value(`tensorlink_worker_reputation{peer="${A}"}`), 0.25);
    assert.equal(value(`tensorlink_worker_checks_total{peer="${A}",result="failed"}`), 1);
    assert.equal(value(`tensorlink_worker_excluded{peer="${A}"}`), 1);
    assert.equal(value(`tensorlink_worker_stake_tokens{peer="${A}"}`), 50);
    assert.equal(value(`tensorlink_worker_earned_tokens{peer="${A}"}`), 1.5);
    assert.equal(value(`tensorlink_link_rtt_seconds{from="${A}",to="${B}"}`), 0.0015);
    assert.equal(value(`tensorlink_job_step{job_id="job-1",owner="${A}",kind="train",state="running"}`), 7);
    assert.equal(value(`tensorlink_job_stage_seconds{job_id="job-1",owner="${A}",stage="1"}`), 0.03);
    assert.equal(value('tensorlink_ledger_height'), 2);
    assert.equal(value(`tensorlink_worker_ledger_flops{peer="${A}"}`), 1e9);
    assert.equal(value('tensorlink_peers{role="worker"}'), 1);
  });

  test('label values are escaped', () => {
    const serving = { model: 'a "quoted"\\model\n', requests: { 200: 2 }, promptTokens: 3, completionTokens: 4, waiting: 0, firstToken: { seconds: 0.5, count: 2 }, tokensPerSecond: 1 };
    const text = metricsText({ at: 1, overview: null, serving });
    assert.ok(text.includes('tensorlink_serve_requests_total{code="200",model="a \\"quoted\\"\\\\model\\n"} 2'), text);
    assert.ok(text.includes('tensorlink_serve_time_to_first_token_seconds_count{model="a \\"quoted\\"\\\\model\\n"} 2'));
  });
});
