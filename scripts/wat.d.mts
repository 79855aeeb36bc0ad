/** The binary module of the `.wat` file at `path` (wabt, SIMD and bulk memory on). */
export function assembleWat(path: string): Promise<Uint8Array<ArrayBuffer>>;
/** Where the GEMM's text lives, under the project's root. */
export const GEMM_WAT: string;
/** Where its assembled bytes live (TypeScript), under the project's root. */
export const GEMM_BYTES_TS: string;
/** gemm-wasm-bytes.ts's text for the module `bytes`. */
export function bytesModule(bytes: Uint8Array): string;
