/** The binary module of the `.wat` file at `path` (wabt, SIMD and bulk memory on). */
export function assembleWat(path: string): Promise<Uint8Array<ArrayBuffer>>;
