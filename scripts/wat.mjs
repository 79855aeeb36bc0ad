// Assembles a WebAssembly text file (SIMD and bulk memory on) with wabt: the tab's GEMM (web/lend/gemm.wat), for the
// /lend bundle and for the test that checks it against the js backend.
import { readFileSync } from 'node:fs';
import wabt from 'wabt';

/** The binary module of the `.wat` file at `path`. */
export async function assembleWat(path) {
  const w = await wabt();
  const mod = w.parseWat(path, readFileSync(path, 'utf8'), { simd: true, bulk_memory: true });
  try {
    mod.validate();
    return Uint8Array.from(mod.toBinary({}).buffer);
  } finally {
    mod.destroy();
  }
}
