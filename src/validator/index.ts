/** The validator's room: the registry of live peers. Later: verification, the ledger, settlement. */
export { PEER_TTL_MS, Registry } from './registry.ts';
export { startValidator, type Validator, type ValidatorOptions } from './validator.ts';
