/** The chain's numbers every role reads, apart from the chain client (so that reading them loads no Ethereum library). */

/** The stake a worker locks to be given work: 100 tokens (of 18 decimals). */
export const MIN_STAKE = 100n * 10n ** 18n;
/** What verified work is paid from a job's escrow: token units per FLOP (1 token per 10¹² FLOPs). */
export const PRICE_PER_FLOP = 10n ** 6n;
/** The share of a stake a proven cheat costs, in basis points. */
export const SLASH_BPS = 5_000n;
