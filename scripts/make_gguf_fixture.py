#!/usr/bin/env python3
"""Writes test/fixtures/llama-cpp-written.gguf and .json with llama.cpp's own ggml library (ctypes, no build):
the libggml-base.so that the npm package @node-llama-cpp/linux-x64 ships prebuilt (node-llama-cpp 3.21.1).

The file is written by ggml's gguf writer (gguf_init_empty, gguf_set_*, gguf_add_tensor, gguf_write_to_file) and
its tensors quantized by ggml_quantize_chunk (Q8_0, Q4_0, Q4_K, Q6_K, F16, BF16); the JSON holds the float32 values
quantized and the values ggml's own dequantize_row_* gives back, so test/io/gguf.test.ts checks our reader, our
Q4_K / Q6_K dequantization and our Q8_0 / Q4_0 packing against llama.cpp's code on a file another tool wrote.

  npm install --prefix /tmp/nlc node-llama-cpp@3.21.1   (once; it ships the library)
  python3 scripts/make_gguf_fixture.py [/path/to/libggml-base.so]
"""
import ctypes
import glob
import json
import math
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
default = glob.glob('/tmp/nlc/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so')
lib = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else default[0])


class InitParams(ctypes.Structure):
    _fields_ = [('mem_size', ctypes.c_size_t), ('mem_buffer', ctypes.c_void_p), ('no_alloc', ctypes.c_bool)]


c_p, c_char_p, c_i64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64
lib.ggml_init.restype = c_p
lib.ggml_init.argtypes = [InitParams]
lib.ggml_new_tensor_2d.restype = c_p
lib.ggml_new_tensor_2d.argtypes = [c_p, ctypes.c_int, c_i64, c_i64]
lib.ggml_new_tensor_1d.restype = c_p
lib.ggml_new_tensor_1d.argtypes = [c_p, ctypes.c_int, c_i64]
lib.ggml_get_data.restype = c_p
lib.ggml_get_data.argtypes = [c_p]
lib.ggml_set_name.argtypes = [c_p, c_char_p]
lib.ggml_quantize_chunk.restype = ctypes.c_size_t
lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, c_p, c_p, c_i64, c_i64, c_i64, c_p]
lib.gguf_init_empty.restype = c_p
lib.gguf_set_val_str.argtypes = [c_p, c_char_p, c_char_p]
lib.gguf_set_val_u32.argtypes = [c_p, c_char_p, ctypes.c_uint32]
lib.gguf_set_val_i32.argtypes = [c_p, c_char_p, ctypes.c_int32]
lib.gguf_set_val_f32.argtypes = [c_p, c_char_p, ctypes.c_float]
lib.gguf_set_val_bool.argtypes = [c_p, c_char_p, ctypes.c_bool]
lib.gguf_set_arr_str.argtypes = [c_p, c_char_p, ctypes.POINTER(c_char_p), ctypes.c_size_t]
lib.gguf_set_arr_data.argtypes = [c_p, c_char_p, ctypes.c_int, c_p, ctypes.c_size_t]
lib.gguf_add_tensor.argtypes = [c_p, c_p]
lib.gguf_write_to_file.restype = ctypes.c_bool
lib.gguf_write_to_file.argtypes = [c_p, c_char_p, ctypes.c_bool]
for name in ['q8_0', 'q4_0', 'q4_K', 'q6_K']:
    getattr(lib, f'dequantize_row_{name}').argtypes = [c_p, c_p, c_i64]

TYPES = {'F32': 0, 'F16': 1, 'Q4_0': 2, 'Q8_0': 8, 'Q4_K': 12, 'Q6_K': 14, 'BF16': 30}
BLOCK = {'F32': (1, 4), 'F16': (1, 2), 'BF16': (1, 2), 'Q8_0': (32, 34), 'Q4_0': (32, 18), 'Q4_K': (256, 144), 'Q6_K': (256, 210)}


def f32(x):
    return struct.unpack('<f', struct.pack('<f', x))[0]


def short(xs):
    """float32 values as the 9 significant digits that give each back."""
    return [float('%.9g' % x) for x in xs]


def values(n, seed):
    """Deterministic float32 weights of varied scale, with one block of zeros and one of equal values."""
    out = [f32(math.sin(i * 0.37 + seed) * (1 + (i * 7 + seed) % 5) * 0.05) for i in range(n)]
    if n >= 96:
        out[32:64] = [0.0] * 32
        out[64:96] = [f32(0.125)] * 32
    return out


ctx = lib.ggml_init(InitParams(1 << 20, None, False))
gguf = lib.gguf_init_empty()
lib.gguf_set_val_str(gguf, b'general.architecture', b'llama')
lib.gguf_set_val_str(gguf, b'general.name', 'written by ggml \u00fc'.encode())
lib.gguf_set_val_u32(gguf, b'llama.block_count', 2)
lib.gguf_set_val_i32(gguf, b'test.i32', -7)
lib.gguf_set_val_f32(gguf, b'test.f32', 1e-5)
lib.gguf_set_val_bool(gguf, b'test.bool', True)
strs = [b'a', b'\xc4\xa0b', b'<|endoftext|>']
lib.gguf_set_arr_str(gguf, b'test.strings', (c_char_p * 3)(*strs), 3)
ints = (ctypes.c_int32 * 4)(1, 1, 3, 5)
lib.gguf_set_arr_data(gguf, b'test.int32s', 5, ctypes.cast(ints, c_p), 4)

expected = {'metadata': {'general.architecture': 'llama', 'general.name': 'written by ggml \u00fc', 'llama.block_count': 2,
                         'test.i32': -7, 'test.f32': f32(1e-5), 'test.bool': True, 'test.strings': [s.decode() for s in strs],
                         'test.int32s': [1, 1, 3, 5]},
            'tensors': {}}
for name, type_, rows, cols, seed in [('q4k', 'Q4_K', 2, 256, 1), ('q6k', 'Q6_K', 2, 256, 2), ('q8', 'Q8_0', 2, 64, 3),
                                      ('q4', 'Q4_0', 2, 64, 4), ('half', 'F16', 1, 96, 5), ('brain', 'BF16', 1, 96, 6),
                                      ('vec', 'F32', 1, 40, 7)]:
    src = values(rows * cols, seed)
    size, width = BLOCK[type_]
    t = lib.ggml_new_tensor_2d(ctx, TYPES[type_], cols, rows) if rows > 1 else lib.ggml_new_tensor_1d(ctx, TYPES[type_], cols)
    lib.ggml_set_name(t, name.encode())
    data = lib.ggml_get_data(t)
    if type_ == 'F32':
        ctypes.memmove(data, (ctypes.c_float * len(src))(*src), 4 * len(src))
    else:
        written = lib.ggml_quantize_chunk(TYPES[type_], (ctypes.c_float * len(src))(*src), data, 0, rows, cols, None)
        assert written == rows * cols // size * width, (name, written)
    entry = {'type': type_, 'shape': [rows, cols] if rows > 1 else [cols], 'source': short(src)}
    fn = {'Q4_K': 'q4_K', 'Q6_K': 'q6_K', 'Q8_0': 'q8_0', 'Q4_0': 'q4_0'}.get(type_)
    if fn:
        out = (ctypes.c_float * (rows * cols))()
        getattr(lib, f'dequantize_row_{fn}')(data, ctypes.cast(out, c_p), rows * cols)
        entry['dequantized'] = short(out)
    lib.gguf_add_tensor(gguf, t)
    expected['tensors'][name] = entry

fixtures = ROOT / 'test' / 'fixtures'
assert lib.gguf_write_to_file(gguf, str(fixtures / 'llama-cpp-written.gguf').encode(), False)
(fixtures / 'llama-cpp-written.json').write_text(json.dumps(expected, separators=(',', ':')) + '\n')
print('wrote', fixtures / 'llama-cpp-written.gguf', (fixtures / 'llama-cpp-written.gguf').stat().st_size, 'bytes')
