import type { HostedModelEntry, JobView, Overview, OverviewEvent, PeerRecord, ServingStats } from './types.ts';
import { Chart } from './chart.tsx';
import { ago, bytes, fixed, flops, short, tlk } from './format.ts';
import { reach } from '../../src/p2p/reach.ts';

/** How the dashboard names a peer's reach and a link's path. */
const REACH = { public: 'public', webrtc: 'behind NAT: WebRTC', relayed: 'behind NAT: relayed', private: 'private' } as const;
const PATH = { direct: '', webrtc: 'WebRTC', relayed: 'relayed' } as const;

export function Peers({ overview, now }: { overview: Overview; now: number }) {
  const chain = overview.peers.some((p) => p.stake !== undefined);
  return (
    <section class="panel wide">
      <h2>Peers <span class="count">{overview.peers.length}</span></h2>
      <table data-testid="peers">
        <thead>
          <tr>
            <th>peer</th><th>role</th><th>reach</th><th>tier</th><th>engine</th><th>GFLOP/s</th><th>memory (used / offered)</th>
            <th>reputation</th><th>checks ✓ / ✗</th>{chain && <th>stake · earned (TLK)</th>}<th>seen</th>
          </tr>
        </thead>
        <tbody>
          {overview.peers.map((p) => <PeerRow key={p.peerId} p={p} now={now} chain={chain} />)}
        </tbody>
      </table>
    </section>
  );
}

function PeerRow({ p, now, chain }: { p: PeerRecord; now: number; chain: boolean }) {
  const c = p.capabilities;
  const used = c && c.memoryFreeBytes !== undefined ? c.memoryBytes - c.memoryFreeBytes : 0;
  const rep = p.reputation;
  return (
    <tr data-peer={p.peerId} data-role={p.roles.join(',')} class={p.excluded ? 'excluded' : ''}>
      <td class="mono" title={p.peerId}>{short(p.peerId)}</td>
      <td>{p.roles.map((r) => <span class={`role ${r}`}>{r}</span>)}</td>
      <td data-field="reach">{REACH[reach(p.addrs)]}</td>
      <td>{c ? <span class={`tier t${c.tier}`}>{c.tier}</span> : ''}</td>
      <td>{c ? `${c.backend}, ${c.cores} cores` : ''}</td>
      <td class="num">{c ? c.gflops.toFixed(0) : ''}</td>
      <td>{c ? <Meter value={used} max={c.memoryBytes} text={`${bytes(used)} / ${bytes(c.memoryBytes)}`} /> : ''}</td>
      <td>{rep === undefined ? '' : <Meter value={rep} max={1} text={rep.toFixed(2)} tone={rep < 0.3 ? 'bad' : rep < 0.5 ? 'warn' : 'good'} />}</td>
      <td class="num">{p.checks ? `${p.checks.passed} / ${p.checks.failed}` : ''}{p.excluded ? <span class="flag">EXCLUDED</span> : ''}</td>
      {chain && <td class="num">{p.stake === undefined ? '' : `${tlk(p.stake)} · ${tlk(p.earned)}`}</td>}
      <td class="num">{ago(now - p.lastSeen)}</td>
    </tr>
  );
}

function Meter({ value, max, text, tone = 'good' }: { value: number; max: number; text: string; tone?: string }) {
  const share = max > 0 ? Math.min(1, Math.max(0, value / max)) : 0;
  return (
    <div class={`meter ${tone}`}>
      <div class="fill" style={{ width: `${(share * 100).toFixed(1)}%` }} />
      <span>{text}</span>
    </div>
  );
}

/** Round-trip times and bandwidths between peers, as each measured them (rows: from; columns: to). */
export function Links({ overview }: { overview: Overview }) {
  const peers = overview.peers.filter((p) => p.roles.includes('worker'));
  if (peers.length < 2) return null;
  return (
    <section class="panel">
      <h2>Links</h2>
      <table class="matrix" data-testid="links">
        <thead><tr><th>from \ to</th>{peers.map((p) => <th class="mono">{short(p.peerId)}</th>)}</tr></thead>
        <tbody>
          {peers.map((from) => (
            <tr>
              <th class="mono">{short(from.peerId)}</th>
              {peers.map((to) => {
                if (from.peerId === to.peerId) return <td class="self">·</td>;
                const l = from.proximity[to.peerId];
                if (!l) return <td class="none">?</td>;
                const tone = l.rttMs < 2 ? 'good' : l.rttMs < 20 ? 'warn' : 'bad';
                const when = `measured ${new Date(l.measuredAt).toLocaleTimeString()}`;
                const path = l.via ? PATH[l.via] : '';
                return (
                  <td class={`link ${tone}`} title={when} data-via={l.via ?? ''}>
                    {l.rttMs.toFixed(2)} ms<br />{l.mbps.toFixed(0)} Mbit/s{path ? <><br /><span class="dim">{path}</span></> : null}
                  </td>
                );
              })}
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

export function Jobs({ jobs }: { jobs: JobView[] }) {
  return (
    <section class="panel wide">
      <h2>Jobs <span class="count">{jobs.length}</span></h2>
      {jobs.length === 0 ? <p class="empty">No job has reported yet: run <code>tensorlink train --bootstrap …</code> or <code>generate</code>.</p> : null}
      <div class="jobs">{jobs.map((j) => <Job key={`${j.owner}/${j.jobId}`} job={j} />)}</div>
    </section>
  );
}

function Job({ job }: { job: JobView }) {
  const xs = job.history.map((p) => p.step);
  const slowest = Math.max(1e-9, ...job.stageSeconds);
  return (
    <article class={`job ${job.state}`} data-job={job.jobId} data-kind={job.kind}>
      <header>
        <strong>{job.kind === 'train' ? 'training' : job.kind === 'rl' ? 'reinforcement learning' : 'generation'}</strong> {job.model ? <em>{job.model}</em> : null}
        <span class="mono dim"> job {job.jobId.slice(0, 8)} · user {short(job.owner)}</span>
        <span class={`state ${job.state}`}>{job.state}</span>
      </header>
      <dl class="figures">
        <div><dt>{job.kind === 'generate' ? 'calls' : 'step'}</dt><dd data-field="step">{job.step}</dd></div>
        {job.loss !== undefined && <div><dt>loss</dt><dd data-field="loss">{fixed(job.loss, 4)}</dd></div>}
        {job.reward !== undefined && <div><dt>reward</dt><dd data-field="reward">{fixed(job.reward, 3)}</dd></div>}
        {job.accuracy !== undefined && <div><dt>held-out</dt><dd data-field="accuracy">{(100 * job.accuracy).toFixed(1)}%</dd></div>}
        {job.kl !== undefined && <div><dt>KL</dt><dd data-field="kl">{job.kl.toExponential(2)}</dd></div>}
        {job.rolloutTokensPerSecond !== undefined && <div><dt>rollouts tokens/s</dt><dd data-field="rollout-tokens-per-second">{job.rolloutTokensPerSecond.toFixed(0)}</dd></div>}
        <div><dt>tokens/s</dt><dd data-field="tokens-per-second">{job.tokensPerSecond.toFixed(0)}</dd></div>
        <div><dt>tokens</dt><dd>{job.tokens.toLocaleString()}</dd></div>
      </dl>
      <table class="plan" data-testid="plan">
        <thead><tr><th>section</th><th>layers</th><th>workers</th><th>time of the last step</th></tr></thead>
        <tbody>
          {job.stages.map((s, i) => (
            <tr>
              <td>{i}</td>
              <td>{s.start}–{s.end - 1}</td>
              <td class="mono">{s.peers.map((p) => <span class="chip" title={p} data-worker={p}>{short(p)}</span>)}</td>
              <td>{job.stageSeconds[i] === undefined
                ? ''
                : (
                    <div class="bar"><div class="fill" style={{ width: `${((job.stageSeconds[i] / slowest) * 100).toFixed(0)}%` }} /><span>{(job.stageSeconds[i] * 1000).toFixed(0)} ms</span></div>
                  )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <div class="charts">
        {job.kind === 'train' && <Chart label="loss" xs={xs} ys={job.history.map((p) => p.loss ?? null)} color="#f0b429" testId="loss-chart" />}
        {job.kind === 'rl' && <Chart label="reward" xs={xs} ys={job.history.map((p) => p.reward ?? null)} color="#f0b429" testId="reward-chart" />}
        <Chart label="tokens / s" xs={xs} ys={job.history.map((p) => p.tokensPerSecond)} color="#3ebd93" testId="speed-chart" />
      </div>
    </article>
  );
}

export function Events({ overview, now }: { overview: Overview; now: number }) {
  // what people look for first: cheaters caught, stakes cut, peers coming and going; then the checks that passed
  const notable = overview.events.filter((e) => e.kind !== 'check-passed');
  const passed = overview.events.filter((e) => e.kind === 'check-passed');
  const item = (e: OverviewEvent) => (
    <li class={`event ${e.kind}`}>
      <span class="when">{ago(now - e.at)} ago</span> <span class="kind">{e.kind}</span> <span class="mono">{short(e.peer)}</span> <span class="detail">{e.detail}</span>
    </li>
  );
  return (
    <section class="panel">
      <h2>Verification and membership</h2>
      <ol class="events" data-testid="events">
        {notable.length === 0 ? <li class="empty">nothing yet</li> : null}
        {notable.slice(0, 40).map(item)}
      </ol>
      {passed.length > 0 && <h3>checks passed <span class="count">{passed.length} recent</span></h3>}
      <ol class="events passed">{passed.slice(0, 6).map(item)}</ol>
    </section>
  );
}

export function Ledger({ overview }: { overview: Overview }) {
  const l = overview.ledger;
  const work = Object.entries(l.work).sort(([, a], [, b]) => b.flops - a.flops);
  return (
    <section class="panel">
      <h2>Ledger</h2>
      <dl class="figures">
        <div><dt>blocks</dt><dd data-field="height">{l.height}</dd></div>
        <div><dt>records</dt><dd>{l.records}</dd></div>
        <div><dt>pending</dt><dd>{l.pending}</dd></div>
      </dl>
      {l.blocks.length > 0 && (
        <table>
          <thead><tr><th>block</th><th>records</th><th>signatures</th><th>made</th></tr></thead>
          <tbody>{[...l.blocks].reverse().map((b) => <tr><td>{b.height}</td><td>{b.count}</td><td>{b.signers}</td><td>{new Date(b.time).toLocaleTimeString()}</td></tr>)}</tbody>
        </table>
      )}
      {work.length > 0 && (
        <table>
          <thead><tr><th>worker</th><th>records</th><th>accepted work</th></tr></thead>
          <tbody>{work.map(([peer, w]) => <tr><td class="mono">{short(peer)}</td><td>{w.records}</td><td>{flops(w.flops)}</td></tr>)}</tbody>
        </table>
      )}
    </section>
  );
}

export function Serving({ s }: { s: ServingStats }) {
  const answered = Object.values(s.requests).reduce((a, b) => a + b, 0);
  const errors = Object.entries(s.requests).filter(([code]) => Number(code) >= 400).reduce((a, [, n]) => a + n, 0);
  return (
    <section class="panel">
      <h2>Serving <em>{s.model}</em></h2>
      <dl class="figures">
        <div><dt>requests</dt><dd data-field="requests">{answered}</dd></div>
        <div><dt>errors</dt><dd>{errors}</dd></div>
        <div><dt>waiting</dt><dd>{s.waiting}</dd></div>
        <div><dt>tokens/s (1 min)</dt><dd>{s.tokensPerSecond.toFixed(1)}</dd></div>
        <div><dt>first token</dt><dd>{s.firstToken.count ? `${((s.firstToken.seconds / s.firstToken.count) * 1000).toFixed(0)} ms` : '—'}</dd></div>
        <div><dt>tokens in · out</dt><dd>{s.promptTokens} · {s.completionTokens}</dd></div>
      </dl>
    </section>
  );
}

/** Blocks of a hosted model that some online host serves. */
function served(m: HostedModelEntry): number {
  const held = new Array<boolean>(m.layers).fill(false);
  for (const h of m.hosts) {
    if (h.state !== 'online') continue;
    for (let b = h.layers[0]; b <= h.layers[1] && b < m.layers; b++) held[b] = true;
  }
  return held.filter(Boolean).length;
}

/** The models workers host (`worker --host`): coverage of their blocks, and each host's blocks, format, state and sessions. */
export function Models({ models }: { models: HostedModelEntry[] }) {
  return (
    <section class="panel wide">
      <h2>Hosted models <span class="count">{models.length}</span></h2>
      {models.length === 0 ? <p class="empty">No worker hosts a model: run <code>tensorlink worker --host NAME=DIR --bootstrap …</code>.</p> : null}
      {models.map((m) => {
        const sessions = m.hosts.reduce((n, h) => n + (h.sessions ?? 0), 0);
        const blocks = served(m);
        return (
          <article class="model" data-model={m.name} data-hash={m.hash} key={`${m.name}/${m.hash}`}>
            <header>
              <strong>{m.name}</strong> <span class="mono dim" title={m.hash}>{m.hash.slice(0, 12)}…</span>
              <span class={`state ${m.complete ? 'running' : 'closed'}`} data-field="complete">{m.complete ? 'complete' : 'incomplete'}</span>
            </header>
            <dl class="figures">
              <div><dt>blocks served</dt><dd data-field="coverage"><Meter value={blocks} max={m.layers} text={`${blocks} / ${m.layers}`} tone={m.complete ? 'good' : 'bad'} /></dd></div>
              <div><dt>hosts</dt><dd data-field="hosts">{new Set(m.hosts.map((h) => h.peerId)).size}</dd></div>
              <div><dt>sessions</dt><dd data-field="sessions">{sessions}</dd></div>
            </dl>
            <table data-testid="model-hosts">
              <thead><tr><th>host</th><th>blocks</th><th>format</th><th>state</th><th>sessions</th><th>free KV tokens</th></tr></thead>
              <tbody>
                {m.hosts.map((h) => (
                  <tr data-host={h.peerId}>
                    <td class="mono" title={h.peerId}>{short(h.peerId)}</td>
                    <td>{h.layers[0]}–{h.layers[1]}</td>
                    <td>{h.format}</td>
                    <td><span class={`state ${h.state === 'online' ? 'running' : 'closed'}`}>{h.state}</span></td>
                    <td class="num" data-field="host-sessions">{h.sessions ?? ''}</td>
                    <td class="num">{h.freeTokens === undefined ? '' : h.freeTokens.toLocaleString()}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </article>
        );
      })}
    </section>
  );
}
