// Issue #50: the simulation runs the project's own registry, router, planner, placement, sampling, reputation, ledger
// and pay over simulated peers in virtual time. It is deterministic (a seed gives one report, wall-clock figures aside),
// and its figures hold the properties the real parts give them.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { simulateSwarm, type SimulationReport, VirtualClock } from '../../src/sim/index.ts';
import { coordinateError, probeFor } from '../../src/sim/coordinates.ts';
import { makePeers } from '../../src/sim/population.ts';
import { Random } from '../../src/sim/random.ts';
import { validatorRelay } from '../../src/sim/world.ts';
import { PROBE_INTERVAL_MS } from '../../src/worker/probing.ts';

/** A report without what the wall clock measured. */
const virtual = (r: SimulationReport) => ({ ...r, wallSeconds: 0, placementMs: { ...r.placementMs, median: 0, max: 0 } });

describe('the simulation', () => {
  test('its clock runs events in time order, ties in the order they were scheduled, and stops where told', () => {
    const clock = new VirtualClock();
    const ran: string[] = [];
    clock.at(30, () => ran.push('c'));
    clock.at(10, () => {
      ran.push('a');
      clock.after(5, () => ran.push('a+5'));
    });
    clock.at(10, () => ran.push('b'));
    clock.at(100, () => ran.push('late'));
    clock.run(50);
    assert.deepEqual(ran, ['a', 'b', 'a+5', 'c']);
    assert.equal(clock.now(), 50);
    clock.run(100);
    assert.deepEqual(ran.at(-1), 'late');
  });

  test('a seed gives one report; sessions complete over routes no better than the best, cheaters caught, no honest peer flagged', () => {
    const options = { peers: 600, hours: 0.5, seed: 7, cheaterShare: 0.1, jobsPerHour: 8 };
    const r = simulateSwarm(options);
    assert.deepEqual(virtual(simulateSwarm(options)), virtual(r));
    assert.equal(r.sessions, r.sessionsCompleted + Object.values(r.sessionsFailed).reduce((a, b) => a + b, 0) + r.sessionsUnfinished);
    assert.ok(r.sessionsCompleted > 0.9 * r.sessions, JSON.stringify({ ...r, coverage: [], series: [] }));
    // the best route is the router's own with every host's true round trip: no route beats it
    assert.ok(r.routeLatencyRatio.sampled > 0 && r.routeLatencyRatio.median >= 1 - 1e-9);
    assert.ok(r.cheatersCaught > 0 && r.cheatersCaught <= r.cheaters);
    assert.equal(r.honestFlagged, 0);
    // the ledger's blocks hold every piece of work; each caught cheater lost half its stake
    assert.ok(r.economy.blocks > 0 && r.economy.records > 0);
    assert.equal(r.economy.slashed, 50 * r.cheatersCaught);
    assert.ok(r.placementMs.devicesMax > 0, 'the planner placed jobs over the live workers');
    assert.equal(r.coverage.length, 31, 'coverage every virtual minute, from the start');
  });

  // the worst routes of the first runs (up to 10× the best) came from coordinates the simulation let lag: its peers
  // probed at a quarter of a worker's rate, from the origin at the start
  test('coordinates: peers probing at a worker\'s rate settle within minutes; the swarm starts with them settled', () => {
    const hour = 3_600_000;
    const churn = { medianOnlineMs: hour, medianOfflineMs: hour / 2 };
    const peers = makePeers(new Random(3), { peers: 1_000, ...churn, cheaterShare: 0, relayedShare: 0.12 });
    const relay = validatorRelay();
    const online = peers.filter((p) => p.online);
    // the same peers probing at a quarter of the rate (2 others every 5 s: the simulation's rate until #50's fix)
    const slow = online.map((p) => ({ ...p })); // updateCoordinate makes a new coordinate: each copy moves its own
    const rng = new Random(4);
    const error = (of = online) => coordinateError(of, relay, new Random(5));
    assert.ok(error() > 0.5, `from the origin: ${error()}`);
    // two minutes of probes (12 rounds of 10 s), then three more
    for (let t = 0; t < 2 * 60_000; t += PROBE_INTERVAL_MS) probeFor(online, PROBE_INTERVAL_MS, relay, rng);
    const twoMinutes = error();
    for (let t = 0; t < 3 * 60_000; t += PROBE_INTERVAL_MS) probeFor(online, PROBE_INTERVAL_MS, relay, rng);
    const fiveMinutes = error();
    assert.ok(fiveMinutes < 0.05 && fiveMinutes < twoMinutes, `median relative error ${twoMinutes} after 2 minutes, ${fiveMinutes} after 5`);
    for (let t = 0; t < 5 * 60_000; t += PROBE_INTERVAL_MS) probeFor(slow, PROBE_INTERVAL_MS / 4, relay, rng);
    assert.ok(error(slow) > 0.1, `at a quarter of the rate, after 5 minutes: ${error(slow)}`);
    const r = simulateSwarm({ peers: 600, hours: 0.05, seed: 7 });
    assert.ok(r.coordinateError.start < 0.05 && r.coordinateError.end < 0.05, JSON.stringify(r.coordinateError));
  });
});
