/** The validator's room: the registry of live peers. Later: verification, the ledger, settlement. */
export { GOSSIP_FRESH_MS, GossipFreshness, PEER_TTL_MS, Registry } from './registry.ts';
export { checkGossip, GOSSIP_ANNOUNCEMENTS_PER_SECOND, type GossipStats } from './gossip-check.ts';
export { startValidator, type Validator, type ValidatorOptions } from './validator.ts';
export { KNOWN_FOR_MS, RELAY_LIMITS, type RelayLimits, type RelayStats, ValidatorRelayGate } from './relay-gate.ts';
export { EventLog, JOB_CLOSED_MS, JOB_SILENT_MS, JobBoard, PASSED_EVENTS } from './overview.ts';
export { MEMBERSHIP_EVENTS } from './overview.ts';
export { MAX_FLAGS, parseFlag, SharedView, type SignedFlag } from './shared-view.ts';
