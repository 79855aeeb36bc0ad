/**
 * The ends of a hosted model (embedding, final norm, head), its config and tokenizer, pulled from one of its hosts over
 * the control protocol (`tensorlink pull-ends`): 'ends-manifest' pages, then 'ends-chunk' and 'ends-file' pieces.
 */

/** Bytes of weight or file one answer carries: 512 KiB is ~683 KiB of base64, well inside a control message (1 MiB). */
export const ENDS_PIECE_BYTES = 512 * 1024;
/** Weights one manifest page lists at most: a weight's line is its name, shape and one 64-hex hash per 4 MiB chunk. */
export const MANIFEST_PAGE_ITEMS = 200;
/** JSON bytes of weights one manifest page takes at most (well inside a control message, with the config beside it). */
export const MANIFEST_PAGE_BYTES = 384 * 1024;
/** Files beside the weights a host sends: the config and the tokenizer's. */
export const ENDS_FILES = ['config.json', 'tokenizer.json', 'tokenizer_config.json'] as const;
/** Bytes a file beside the weights may take: a large vocabulary's tokenizer.json is ~20 MB. */
export const MAX_ENDS_FILE_BYTES = 64 * 1024 * 1024;
/**
 * How long a puller waits for a manifest page: the first request may make a host hash its whole model (a GGUF file's
 * hashes are not cached on disk), a minute or more for a large one; pieces after it are read from disk in milliseconds.
 */
export const MANIFEST_TIMEOUT_MS = 10 * 60_000;
/** How long a puller waits for one piece of a weight or file. */
export const PIECE_TIMEOUT_MS = 60_000;
