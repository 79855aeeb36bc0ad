/** The probe protocol: small control frames echoed for the round trip, one tensor frame acknowledged for the bandwidth. */
export const PROBE_PROTOCOL = '/tensorlink/probe/1.0.0';

/** Bytes of an active bandwidth probe: big enough to leave slow start on loopback/LAN, small enough to run often. */
export const PROBE_BYTES = 256 * 1024;
/** Round trips timed per probe; the best one counts (the others caught a busy event loop). */
export const PROBE_PINGS = 5;
/** One probe answer may take this long: a probe is a few hundred KiB, seconds even on a slow home link. */
export const PROBE_TIMEOUT_MS = 10_000;
/** Probe streams a peer may hold open: a prober opens one per measurement and closes it. */
export const MAX_PROBE_STREAMS = 8;
/** Largest probe frame: the bandwidth probe's tensor and its header; a longer one is refused at its length. */
export const MAX_PROBE_FRAME_BYTES = PROBE_BYTES + 1024;
/**
 * Frames a peer may send to be answered, per second (a probe is PROBE_PINGS pings and one tensor), and bandwidth probes
 * per second (at most 1 MiB/s of them): a worker probes each peer every 10 s, a user each worker once per plan; room
 * for a few at once. A peer past either gets its stream reset, not answered.
 */
export const PROBE_FRAMES_PER_SECOND = 8 * (PROBE_PINGS + 1);
export const BANDWIDTH_PROBES_PER_SECOND = 4;
/**
 * Passive measurement times a transfer only when at least this many bytes arrived after its
 * header. Its ends are read at event-loop turns, each up to about a millisecond late on a busy
 * worker; 64 KiB at 100 Mbit/s (the planner's default link) lasts 5 ms, so the error stays
 * near 20%, and a smaller transfer would measure the event loop more than the link.
 */
export const MIN_MEASURED_BYTES = 64 * 1024;
/**
 * Weight of a job's transfer in a link's estimate (an exponential average): a link that slowed
 * shows within two transfers, and one odd transfer moves the estimate half way, not all the way.
 */
export const TRAFFIC_WEIGHT = 0.5;
