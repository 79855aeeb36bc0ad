import { setFlagsFromString } from 'node:v8';

/**
 * The old generation may grow to twice what a full collection left before the next one starts. V8 otherwise sizes that
 * headroom from its collection and allocation speeds, and for a node of this project (about 45 MB of live JavaScript
 * objects, tensors outside the heap, little promoted per step) it chooses about 1.1×: less than the young generation's
 * 16 MB, and V8 starts marking the old generation whenever the headroom is below what one scavenge could promote. The
 * demo's workers then ran a full collection every fifth of a second (480 in 600 steps, a quarter of their CPU time;
 * verification's kept state made it likelier, not the cause). With 2× they run about one every few seconds. Set for
 * the CLI's processes only, first thing (the library leaves its host's heap alone).
 */
setFlagsFromString('--heap-growing-percent=100');

export {};
