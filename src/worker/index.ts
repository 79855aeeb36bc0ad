/** The worker's room: the stage server and its handlers, the job table, the chunk store, capabilities. */
export { measureCapabilities } from './capabilities.ts';
export { engineGflops, referenceLogits } from './engine-check.ts';
export { ChunkStore } from './chunk-store.ts';
export { JobTable, MAX_JOBS_PER_WORKER, type JobEntry } from './jobs.ts';
export { type StageServer, type StageServerOptions, serveStages } from './stage-server.ts';
export { activationBytes } from './handlers/train.ts';
export { type JobMemory, MemoryBudget, type MemoryUse } from './memory.ts';
export { ModelIndex } from './model-index.ts';
export { PROBE_INTERVAL_MS } from './probing.ts';
export { ANNOUNCE_INTERVAL_MS, startWorker, type Worker, type WorkerOptions } from './worker.ts';
export { CHEAT_KINDS, type Fault, FAULT_KINDS, FaultInjector, type FaultKind, parseFault } from './fault.ts';
export { type HostSpec, hostModel, modelHash, openModelWeights, parseHostSpec } from './hosting.ts';
export { listFiles, type ModelFiles, modelFiles } from './model-files.ts';
