/**
 * Network coordinates (Vivaldi: Dabek, Cox, Kaashoek and Morris, "Vivaldi: A Decentralized Network Coordinate System",
 * SIGCOMM 2004), with heights: each node is a point in three dimensions plus a height, the time its own access link
 * adds, so that the round trip between two nodes is predicted as their distance plus both heights. A node moves its
 * coordinate a little after each round trip it measures, toward agreeing with it, weighted by how sure it is against
 * how sure the other is. Coordinates let a user predict its round trip to any host from what the host announces,
 * having pinged only a few.
 */

export interface Coordinate {
  /** Position in milliseconds. */
  x: [number, number, number];
  /** Milliseconds its access link adds to every round trip (at least MIN_HEIGHT_MS). */
  height: number;
  /** Its confidence: a moving relative error of its predictions (1 at first). */
  error: number;
}

/** How much of a sample's disagreement a node moves by (cc) and folds into its error (ce): the paper's 0.25 each. */
const CC = 0.25;
const CE = 0.25;
export const MIN_HEIGHT_MS = 0.1;
/** Coordinates beyond this (ms) or errors beyond MAX_ERROR are not believed: a peer's announcement is checked against them. */
export const MAX_COORDINATE_MS = 100_000;
export const MAX_ERROR = 10;

export function origin(): Coordinate {
  return { x: [0, 0, 0], height: MIN_HEIGHT_MS, error: 1 };
}

/** The predicted round trip between two coordinates, ms. */
export function estimateRttMs(a: Coordinate, b: Coordinate): number {
  return Math.hypot(a.x[0] - b.x[0], a.x[1] - b.x[1], a.x[2] - b.x[2]) + a.height + b.height;
}

/**
 * `local` after measuring `rttMs` to a node at `remote`: moved along the line between them (with heights: toward or
 * away from it, and up or down) by CC × its weight × the prediction's error; its error folded toward this sample's.
 * `random` picks a direction where the two coincide (two nodes at the origin at first).
 */
export function updateCoordinate(local: Coordinate, remote: Coordinate, rttMs: number, random: () => number = Math.random): Coordinate {
  if (!(rttMs > 0) || !Number.isFinite(rttMs)) return local;
  const predicted = estimateRttMs(local, remote);
  const weight = local.error / Math.max(1e-9, local.error + remote.error);
  const relative = Math.abs(predicted - rttMs) / rttMs;
  const error = Math.min(MAX_ERROR, relative * CE * weight + local.error * (1 - CE * weight));
  let d = [local.x[0] - remote.x[0], local.x[1] - remote.x[1], local.x[2] - remote.x[2]];
  let norm = Math.hypot(d[0], d[1], d[2]);
  if (norm < 1e-9) {
    d = [random() - 0.5, random() - 0.5, random() - 0.5];
    norm = Math.hypot(d[0], d[1], d[2]) || 1;
  }
  // the unit vector of [x − y, h + g], whose length is ‖x − y‖ + h + g
  const length = norm + local.height + remote.height;
  const force = CC * weight * (rttMs - predicted);
  // within the bounds an announcement is checked against, whatever a peer's answers push it by
  const clamp = (v: number) => Math.max(-MAX_COORDINATE_MS, Math.min(MAX_COORDINATE_MS, v));
  return {
    x: [0, 1, 2].map((i) => clamp(local.x[i] + (force * d[i]) / length)) as [number, number, number],
    height: Math.min(MAX_COORDINATE_MS, Math.max(MIN_HEIGHT_MS, local.height + (force * (local.height + remote.height)) / length)),
    error,
  };
}

/**
 * A node's coordinate fitted from round trips it measured to nodes whose coordinates it knows (a user, from the hosts
 * it pinged): the updates run over the samples `passes` times, starting at the origin.
 */
export function fitCoordinate(
  samples: readonly { coordinate: Coordinate; rttMs: number }[], passes = 20, random: () => number = Math.random,
): Coordinate {
  let c = origin();
  for (let p = 0; p < passes; p++) for (const s of samples) c = updateCoordinate(c, s.coordinate, s.rttMs, random);
  return c;
}
