/**
 * The stage protocol: a job's owner loads a section of a model onto a worker and runs it,
 * over one long-lived stream per job (see schema.ts for the messages).
 */
export const STAGE_PROTOCOL = '/tensorlink/stage/2.0.0';

/** Sessions a job may keep open on a worker: each holds a KV cache; a server batches far fewer users than this. */
export const MAX_SESSIONS_PER_JOB = 256;
/**
 * Sessions one peer may keep open on a hosted span (whose 256 anyone shares): a gateway decoding 32 rows at once fits
 * twice over, and no four peers can shut everyone else out.
 */
export const MAX_SESSIONS_PER_PEER = 64;
/** A session unused for this long is freed: its user has vanished (a decoding step takes milliseconds). */
export const SESSION_IDLE_MS = 60_000;
/**
 * Stage requests a peer may send per second (burst up to the same number). An honest user's
 * busiest stream is token-by-token decoding of a small model, a request every ~0.3 ms; a
 * training step sends a few per micro-batch. The bucket stops a flood from starving other
 * jobs without slowing any honest one.
 */
export const STAGE_MESSAGES_PER_SECOND = 5_000;
/** Stage streams a peer may hold open on a worker: one per job, and a worker holds at most 64 jobs. */
export const MAX_STAGE_STREAMS = 128;
/** Tensors one request may announce: the gradients of a section's parameters travel in one message. */
export const MAX_TENSORS_PER_REQUEST = 4_096;
/** Parameter names one request may list: a section of the largest open models has a few thousand. */
export const MAX_NAMES = 100_000;
/** Characters of a parameter name: Hugging Face names are under 100. */
export const MAX_NAME_LENGTH = 256;
/** Stages a chained forward may still pass through: one per worker of the plan. */
export const MAX_ROUTE = 64;
/** Characters of a session id or a reduction key: ids are UUIDs (36) or `step:group` keys. */
export const MAX_KEY_LENGTH = 128;
/** How long an inference request (a prefill or a decoding step of one section) may take. */
export const STAGE_REQUEST_TIMEOUT_MS = 30_000;
/** How long one training request may take on a worker (a forward or backward of a big section). */
export const TRAIN_REQUEST_TIMEOUT_MS = 300_000;
/**
 * Tensors a training job's neighbours may pass to a worker ahead of the requests that use them:
 * at most one per micro-batch and direction is waiting in a healthy step (a step has far fewer
 * than 128 micro-batches); a flood beyond this is refused.
 */
export const MAX_PASSES_WAITING = 256;
/** How long a request waits for the tensor a neighbour passes it (the user's deadline for the request usually ends it first). */
export const PASS_WAIT_MS = 300_000;
/** Weights travel in chunks of at most this many bytes, each named by its sha256: a request amortised, a load resumable. */
export const CHUNK_BYTES = 4 * 1024 * 1024;
/** Chunks one weight may have: 2^20 × 4 MiB = 4 TiB, far beyond any single tensor. */
export const MAX_CHUNKS_PER_WEIGHT = 1_000_000;
