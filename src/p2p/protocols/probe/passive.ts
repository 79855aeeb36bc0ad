import type { Proximity } from '../../vocabulary.ts';
import { MIN_MEASURED_BYTES, TRAFFIC_WEIGHT } from './constants.ts';

/**
 * Passive measurement: the transfers of a job between workers (a chained forward's hidden
 * states, a reduction's gradients) update the link's estimate between probes.
 *
 * They are timed where they arrive. A sender hands a message to its stream at once, and the
 * stream, its muxer's window (which grows to megabytes) and the kernel's socket buffer take
 * it far faster than the link carries it: timing the send measured 350–700 Mbit/s on a
 * 10 Mbit/s link here, and nothing at all once the window had grown. The receiver sees the
 * bytes come at the link's pace: a message is timed from the event that brought its header to
 * the one that completed it, and the bytes of those later events over that time are the
 * bandwidth achieved from the sender to this peer (9.2–10.2 Mbit/s on that link, 64 KiB to
 * 512 KiB messages).
 */

/** One timed transfer. */
export interface TransferSample {
  bytes: number;
  seconds: number;
  mbps: number;
}

/** Where a message began: the time its header arrived and the bytes received by then (that event's included). */
export interface ArrivalMark {
  at: number;
  bytes: number;
}

/**
 * Counts a stream's arriving bytes and times its messages (pure; times in ms). Feed it every
 * arrival before the frames it carries are decoded, mark a message when its header is decoded,
 * and ask for its sample when its last frame is.
 */
export class ArrivalMeter {
  private total = 0;

  constructor(private readonly minBytes = MIN_MEASURED_BYTES) {}

  arrived(bytes: number): void {
    this.total += bytes;
  }

  mark(now: number): ArrivalMark {
    return { at: now, bytes: this.total };
  }

  /** The message begun at `mark` is complete: its sample, or null when too few bytes came after its header to time. */
  sample(mark: ArrivalMark, now: number): TransferSample | null {
    const bytes = this.total - mark.bytes;
    const seconds = (now - mark.at) / 1000;
    if (bytes < this.minBytes || seconds <= 0) return null;
    return { bytes, seconds, mbps: (bytes * 8) / 1e6 / seconds };
  }
}

/**
 * A link's estimate with a transfer from that peer folded in: its `inbound` bandwidth an
 * exponential average (TRAFFIC_WEIGHT on the transfer; the first transfer alone to begin
 * with), stamped now. The probe's own figures (this peer → that one) are kept. A peer not yet
 * probed has no entry to fold into: undefined (its first probe makes it).
 */
export function foldTransfer(entry: Proximity | undefined, sample: TransferSample, now = Date.now()): Proximity | undefined {
  if (!entry) return undefined;
  const before = entry.inbound?.mbps;
  const mbps = before === undefined ? sample.mbps : TRAFFIC_WEIGHT * sample.mbps + (1 - TRAFFIC_WEIGHT) * before;
  return { ...entry, inbound: { mbps: Math.round(mbps * 10) / 10, measuredAt: now } };
}
