export { CONTROL_PROTOCOL, request, serveControl, type Handler } from './control.ts';
export { measureCapabilities } from './capabilities.ts';
export { PEER_TTL_MS, startValidator, type Validator } from './validator.ts';
export { ANNOUNCE_INTERVAL_MS, startWorker, type Worker } from './worker.ts';
export { type Capabilities, type PeerRecord, type Role, type Tier, tierOf } from './vocabulary.ts';
export { type LocalPeer, type LocalSwarm, localSwarm } from './local-swarm.ts';
export { type Proximity, PROBE_PROTOCOL, probe, serveProbes } from './proximity.ts';
export { JobTable, MAX_JOBS_PER_WORKER, type JobEntry } from './jobs.ts';
export { createLogger, isLogLevel, type Logger, type LogLevel } from './log.ts';
