/**
 * The world the simulated peers live in: where they are, how they reach the internet, and what they compute with.
 * Round trips come from great-circle distance (light in fibre covers about 200 km a millisecond, and routes run about
 * 1.5 times the straight line) plus each end's access delay; bandwidth is the sender's uplink or the receiver's
 * downlink, whichever is less; a peer behind a NAT that nothing can punch through is reached through the validator's
 * relay (both legs, at most the relay's share of bandwidth).
 */
import type { Random } from './random.ts';

export interface Region {
  name: string;
  lat: number;
  lon: number;
  /** Share of peers and users there. */
  weight: number;
}

/** Metropolitan areas with much of the world's broadband, weighted roughly by it. */
export const REGIONS: readonly Region[] = [
  { name: 'frankfurt', lat: 50.1, lon: 8.7, weight: 0.13 },
  { name: 'london', lat: 51.5, lon: -0.1, weight: 0.1 },
  { name: 'virginia', lat: 39.0, lon: -77.5, weight: 0.13 },
  { name: 'toronto', lat: 43.7, lon: -79.4, weight: 0.03 },
  { name: 'california', lat: 37.8, lon: -122.4, weight: 0.1 },
  { name: 'sao-paulo', lat: -23.5, lon: -46.6, weight: 0.06 },
  { name: 'lagos', lat: 6.5, lon: 3.4, weight: 0.03 },
  { name: 'mumbai', lat: 19.1, lon: 72.9, weight: 0.08 },
  { name: 'singapore', lat: 1.35, lon: 103.8, weight: 0.06 },
  { name: 'beijing', lat: 39.9, lon: 116.4, weight: 0.08 },
  { name: 'seoul', lat: 37.6, lon: 127.0, weight: 0.05 },
  { name: 'tokyo', lat: 35.7, lon: 139.7, weight: 0.08 },
  { name: 'sydney', lat: -33.9, lon: 151.2, weight: 0.04 },
];

/** How a peer reaches the internet: its link's speeds (Mbit/s) and the round-trip time its last mile adds. */
export interface AccessTier {
  name: 'fibre' | 'cable' | 'mobile';
  upMbps: number;
  downMbps: number;
  accessMs: number;
  weight: number;
}

export const ACCESS_TIERS: readonly AccessTier[] = [
  { name: 'fibre', upMbps: 500, downMbps: 1000, accessMs: 2, weight: 0.35 },
  { name: 'cable', upMbps: 30, downMbps: 300, accessMs: 10, weight: 0.45 },
  { name: 'mobile', upMbps: 15, downMbps: 60, accessMs: 30, weight: 0.2 },
];

/**
 * What a peer computes with: the speed our engine reaches on it (GFLOP/s for a decoder's matrix products, not the
 * chip's peak) and the memory it lends.
 */
export interface DeviceTier {
  name: 'datacentre-gpu' | 'gaming-gpu' | 'laptop-cpu' | 'browser-tab';
  gflops: number;
  memoryBytes: number;
  weight: number;
}

const GiB = 2 ** 30;
export const DEVICE_TIERS: readonly DeviceTier[] = [
  { name: 'datacentre-gpu', gflops: 100_000, memoryBytes: 72 * GiB, weight: 0.02 },
  { name: 'gaming-gpu', gflops: 20_000, memoryBytes: 14 * GiB, weight: 0.28 },
  { name: 'laptop-cpu', gflops: 150, memoryBytes: 8 * GiB, weight: 0.5 },
  { name: 'browser-tab', gflops: 30, memoryBytes: 2 * GiB, weight: 0.2 },
];

/** Where a simulated node is and how it is connected. */
export interface Place {
  region: number;
  lat: number;
  lon: number;
  access: AccessTier;
  /** Behind a NAT nothing punches through: reached through the validator's relay. */
  relayed: boolean;
}

/** A place drawn from the world's weights: a region, a spot within about 300 km of its centre, an access tier. */
export function drawPlace(rng: Random, relayedShare: number): Place {
  const region = REGIONS.indexOf(rng.pick(REGIONS));
  const r = REGIONS[region];
  return {
    region,
    lat: r.lat + (rng.next() - 0.5) * 5,
    lon: r.lon + (rng.next() - 0.5) * 5,
    access: rng.pick(ACCESS_TIERS),
    relayed: rng.next() < relayedShare,
  };
}

/** Great-circle distance in km. */
export function distanceKm(a: { lat: number; lon: number }, b: { lat: number; lon: number }): number {
  const rad = Math.PI / 180;
  const dLat = (b.lat - a.lat) * rad;
  const dLon = (b.lon - a.lon) * rad;
  const h = Math.sin(dLat / 2) ** 2 + Math.cos(a.lat * rad) * Math.cos(b.lat * rad) * Math.sin(dLon / 2) ** 2;
  return 2 * 6371 * Math.asin(Math.min(1, Math.sqrt(h)));
}

/** Round-trip milliseconds of a straight path: 1.5 × distance there and back at 200 km/ms, plus both access delays. */
function directRttMs(a: Place, b: Place): number {
  return (distanceKm(a, b) * 1.5 * 2) / 200 + a.access.accessMs + b.access.accessMs;
}

/** The validator's relay: where it is, and the bandwidth one relayed connection gets (Mbit/s). */
export interface Relay {
  place: Place;
  mbps: number;
}

/** The validator and its relay: in a Frankfurt datacentre, 50 Mbit/s for each relayed connection. */
export function validatorRelay(): Relay {
  const access = { name: 'fibre' as const, upMbps: 10_000, downMbps: 10_000, accessMs: 1, weight: 0 };
  return { place: { region: 0, lat: REGIONS[0].lat, lon: REGIONS[0].lon, access, relayed: false }, mbps: 50 };
}

/** Round-trip ms between two places, through the relay where either end is behind a NAT that cannot be punched. */
export function rttMs(a: Place, b: Place, relay: Relay): number {
  if (!a.relayed && !b.relayed) return directRttMs(a, b);
  return directRttMs(a, relay.place) + directRttMs(relay.place, b) - relay.place.access.accessMs * 2;
}

/** Bandwidth a → b in Mbit/s: the sender's uplink or the receiver's downlink, and the relay's share through it. */
export function mbps(a: Place, b: Place, relay: Relay): number {
  const direct = Math.min(a.access.upMbps, b.access.downMbps);
  return a.relayed || b.relayed ? Math.min(direct, relay.mbps) : direct;
}
