/**
 * Limits and timeouts shared by every TensorLink protocol, each with the reason for its
 * value. What belongs to one protocol lives in its folder: protocols/<name>/constants.ts.
 */

/** Largest frame accepted from a peer: a 64 MiB tensor plus headroom; bigger tensors are sent in parts. */
export const MAX_FRAME_BYTES = 256 * 1024 * 1024;
/** Largest JSON control message: control messages describe work, they never carry tensors. */
export const MAX_CONTROL_BYTES = 1024 * 1024;
/** Largest frame of a protocol that carries only control messages: its length is refused before a byte is buffered. */
export const MAX_CONTROL_FRAME_BYTES = MAX_CONTROL_BYTES + 1;
/** Highest tensor rank accepted: real activations have at most 5 dims. */
export const MAX_TENSOR_RANK = 8;
/** Dialing a peer gives up after this: a TCP dial plus noise and yamux handshakes take ~10 ms on a LAN, ~1 s across continents. */
export const DIAL_TIMEOUT_MS = 10_000;
/**
 * A connection is aborted when its peer has not answered libp2p's keep-alive ping within this.
 * libp2p's default of 5 s takes a busy peer for a dead one: a worker running a large section
 * on the js backend holds its event loop for seconds, longer on a loaded machine.
 * A process that dies closes its sockets at once; this only bounds how long a silent host is kept.
 */
export const PING_TIMEOUT_MS = 60_000;
/** How often libp2p pings each connected peer (its RTT, and the check above): a few times per PING_TIMEOUT_MS. */
export const PING_INTERVAL_MS = 20_000;
/**
 * Pings open at once per connection, each way: those sent while a peer is busy, plus one
 * (past libp2p's default, 1 out and 2 in, the next ping fails and aborts the connection).
 */
export const PING_STREAMS = Math.ceil(PING_TIMEOUT_MS / PING_INTERVAL_MS) + 1;
/** Bytes per send() call on a stream: large enough to amortise framing, small enough to interleave jobs. */
export const SEND_CHUNK_BYTES = 1024 * 1024;
/**
 * A send gives up when the peer has taken no bytes for this long: it stopped reading (or its
 * link died), and its stream is reset rather than holding the sender forever. Progress, not
 * the whole transfer, is timed: a 64 MiB tensor over a 10 Mbit/s link takes a minute but
 * drains the send buffer every few milliseconds.
 */
export const SEND_STALL_MS = 30_000;
