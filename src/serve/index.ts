/** The faces people use: the OpenAI-compatible HTTP API, the dashboard of the swarm, and its metrics. */
export { ChatFormat, type ChatMessage, DEFAULT_CHAT_STOPS, DEFAULT_CHAT_TEMPLATE } from './chat.ts';
export { ApiError, MAX_N, MAX_PROMPTS, MAX_STOPS, parseChat, parseCompletion } from './openai.ts';
export { type BatchRunner, MAX_BATCH_ROWS, MAX_QUEUED, type Row, Scheduler, streamedOnce } from './scheduler.ts';
export { ContinuousScheduler, type RowScheduler } from './continuous.ts';
export { countSpeculative, type DraftSettings, type SpeculativeCounts, speculativeCounts, speculativeRunner } from './speculative.ts';
export { MAX_SESSION_ROWS, SessionRows } from './session-rows.ts';
export { type ApiServer, serveApi, type ServedModel, type ServeOptions } from './server.ts';
export { TextStream } from './text-stream.ts';
export { DASHBOARD_DIR, DASHBOARD_PUSH_MS, type DashboardServer, type DashboardSource, dashboardRoutes, serveDashboard } from './dashboard.ts';
export { type DashboardState, metricsText, type ServingStats } from './metrics.ts';
