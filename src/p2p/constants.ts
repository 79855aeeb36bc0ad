/** Limits and timeouts of TensorLink's protocols, each with the reason for its value. */

/** Largest frame accepted from a peer: a 64 MiB tensor plus headroom; bigger tensors are sent in parts. */
export const MAX_FRAME_BYTES = 256 * 1024 * 1024;
/** Largest JSON control message: control messages describe work, they never carry tensors. */
export const MAX_CONTROL_BYTES = 1024 * 1024;
/** Highest tensor rank accepted: real activations have at most 5 dims. */
export const MAX_TENSOR_RANK = 8;
/** A request without an answer is abandoned after this: a slow loopback peer answers in milliseconds. */
export const REQUEST_TIMEOUT_MS = 30_000;
/** Dialing a peer gives up after this: a TCP dial plus noise and yamux handshakes take ~10 ms on a LAN. */
export const DIAL_TIMEOUT_MS = 10_000;
/** Bytes per send() call on a stream: large enough to amortise framing, small enough to interleave jobs. */
export const SEND_CHUNK_BYTES = 1024 * 1024;
/** Control messages a peer may send per second (burst up to the same number): status and announcements need a few. */
export const MAX_MESSAGES_PER_SECOND = 200;
/** Bytes of an active bandwidth probe: big enough to leave slow start on loopback/LAN, small enough to run often. */
export const PROBE_BYTES = 256 * 1024;
