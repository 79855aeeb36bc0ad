/** The control protocol: JSON requests {id, type, ...} answered by {id, type, ...} or {id, type: 'error', error, message}. */
export const CONTROL_PROTOCOL = '/tensorlink/control/1.0.0';

/** Control messages a peer may send per second (burst up to the same number): status and announcements need a few. */
export const MAX_MESSAGES_PER_SECOND = 200;
/** A control request without an answer is abandoned after this: every handler answers from memory in milliseconds. */
export const REQUEST_TIMEOUT_MS = 30_000;
/** Control streams one peer may hold open at once: a client opens one per request and closes it after the answer. */
export const MAX_INBOUND_STREAMS = 64;
/** Bytes of gossip one peer record may take: a record with a full proximity table is ~100 KiB at most. */
export const MAX_GOSSIP_BYTES = 64 * 1024;
/** The gossip topic on which peers publish their records (capabilities, proximity). */
export const PEERS_TOPIC = '/tensorlink/peers/1.0.0';
