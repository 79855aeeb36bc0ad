import 'uplot/dist/uPlot.min.css';
import './style.css';
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { Events, Jobs, Ledger, Links, Models, Peers, Serving } from './panels.tsx';
import { ago, short } from './format.ts';
import type { DashboardState } from './types.ts';

/**
 * The swarm's dashboard: one state object pushed by the server every second (server-sent
 * events from /api/stream), drawn whole each time. The page fetches nothing else.
 */
function App() {
  const [state, setState] = useState<DashboardState | null>(null);
  const [live, setLive] = useState(false);
  useEffect(() => {
    const source = new EventSource('/api/stream');
    source.onopen = () => setLive(true);
    source.onerror = () => setLive(false);
    source.onmessage = (e: MessageEvent<string>) => {
      setState(JSON.parse(e.data) as DashboardState);
      setLive(true);
    };
    return () => source.close();
  }, []);
  if (!state) return <p class="loading">connecting to the swarm…</p>;
  const o = state.overview;
  const workers = o?.peers.filter((p) => p.roles.includes('worker')) ?? [];
  return (
    <main>
      <header class="top">
        <h1>TensorLink</h1>
        <span class={`live ${live ? 'on' : 'off'}`} data-testid="live">{live ? 'live' : 'reconnecting'}</span>
        {o && (
          <span class="summary">
            validator <span class="mono" title={o.validator}>{short(o.validator)}</span> · up {ago(o.uptimeMs)} ·{' '}
            <strong data-testid="worker-count">{workers.length}</strong> workers · {o.jobs.filter((j) => j.state === 'running').length} jobs running
          </span>
        )}
      </header>
      {state.error && <p class="error">{state.error}</p>}
      <div class="grid">
        {state.serving && <Serving s={state.serving} />}
        {o && <Jobs jobs={o.jobs} />}
        {o?.models && o.models.length > 0 && <Models models={o.models} />}
        {o && <Peers overview={o} now={state.at} />}
        {o && <Links overview={o} />}
        {o && <Events overview={o} now={state.at} />}
        {o && <Ledger overview={o} />}
      </div>
    </main>
  );
}

render(<App />, document.getElementById('app')!);
