// Assembles the js backend's GEMM (src/tensor/kernels/gemm.wat) into src/tensor/kernels/gemm-wasm-bytes.ts, the
// module's bytes in base64, committed so that the engine needs no assembler at run time (test/tensor/wasm-gemm.test.ts
// checks that the two agree). Run it after editing gemm.wat:
//   node scripts/assemble-gemm.mjs
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { assembleWat, bytesModule, GEMM_BYTES_TS, GEMM_WAT } from './wat.mjs';

const root = fileURLToPath(new URL('..', import.meta.url));
const bytes = await assembleWat(root + GEMM_WAT);
writeFileSync(root + GEMM_BYTES_TS, bytesModule(bytes));
process.stdout.write(`${GEMM_BYTES_TS}: ${bytes.length} bytes of WebAssembly\n`);
