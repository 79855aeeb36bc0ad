;; The js backend's GEMM (gemmNN in matmul.ts) in WebAssembly SIMD, which the js backend runs wherever WebAssembly SIMD
;; does (Node, and a tab's engine: browser-wasm): C[m, n] = A[m, k] @ B[k, n], float32 in and out, every output
;; accumulated in float64 over k in increasing order and rounded once, rows four at a time over column blocks of 256:
;; the same operations in the same order as the TypeScript kernel, two columns per f64x2 lane pair (a product then a
;; sum, each rounded: no fused multiply-add, no relaxed SIMD), so its results equal the TypeScript kernel's bit for bit
;; on every machine. Arguments are byte offsets into the exported memory; `acc` is scratch for 4 x 256 float64.
;; `node scripts/assemble-gemm.mjs` assembles it into gemm-wasm-bytes.ts (committed; a test checks the two agree).
(module
  (memory (export "memory") 1)
  (func (export "gemm_nn") (param $a i32) (param $b i32) (param $c i32) (param $m i32) (param $k i32) (param $n i32) (param $acc i32)
    (local $j0 i32) (local $jn i32) (local $i0 i32) (local $rows i32) (local $r i32) (local $p i32) (local $j i32)
    (local $row i32) (local $brow i32) (local $at i32) (local $o i32) (local $stride i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128) (local $bv v128)
    (local $s0 f64) (local $s1 f64) (local $s2 f64) (local $s3 f64) (local $bs f64)
    ;; one row of A is k floats
    (local.set $stride (i32.shl (local.get $k) (i32.const 2)))
    (local.set $j0 (i32.const 0))
    (block $done_j0 (loop $each_j0
      (br_if $done_j0 (i32.ge_u (local.get $j0) (local.get $n)))
      (local.set $jn (select (i32.const 256) (i32.sub (local.get $n) (local.get $j0))
        (i32.lt_u (i32.const 256) (i32.sub (local.get $n) (local.get $j0)))))
      (local.set $i0 (i32.const 0))
      (block $done_i0 (loop $each_i0
        (br_if $done_i0 (i32.ge_u (local.get $i0) (local.get $m)))
        (local.set $rows (select (i32.const 4) (i32.sub (local.get $m) (local.get $i0))
          (i32.lt_u (i32.const 4) (i32.sub (local.get $m) (local.get $i0)))))
        ;; acc = 0 (4 x 256 float64)
        (memory.fill (local.get $acc) (i32.const 0) (i32.const 8192))
        (if (i32.eq (local.get $rows) (i32.const 4))
          (then
            (local.set $row (i32.add (local.get $a) (i32.mul (local.get $i0) (local.get $stride))))
            (local.set $p (i32.const 0))
            (block $done_p (loop $each_p
              (br_if $done_p (i32.ge_u (local.get $p) (local.get $k)))
              (local.set $at (i32.add (local.get $row) (i32.shl (local.get $p) (i32.const 2))))
              (local.set $s0 (f64.promote_f32 (f32.load (local.get $at))))
              (local.set $s1 (f64.promote_f32 (f32.load (i32.add (local.get $at) (local.get $stride)))))
              (local.set $s2 (f64.promote_f32 (f32.load (i32.add (local.get $at) (i32.shl (local.get $stride) (i32.const 1))))))
              (local.set $s3 (f64.promote_f32 (f32.load (i32.add (local.get $at) (i32.mul (local.get $stride) (i32.const 3))))))
              (local.set $a0 (f64x2.splat (local.get $s0)))
              (local.set $a1 (f64x2.splat (local.get $s1)))
              (local.set $a2 (f64x2.splat (local.get $s2)))
              (local.set $a3 (f64x2.splat (local.get $s3)))
              (local.set $brow (i32.add (local.get $b) (i32.shl (i32.add (i32.mul (local.get $p) (local.get $n)) (local.get $j0)) (i32.const 2))))
              (local.set $j (i32.const 0))
              (block $done_j (loop $each_j
                (br_if $done_j (i32.gt_u (i32.add (local.get $j) (i32.const 2)) (local.get $jn)))
                (local.set $bv (f64x2.promote_low_f32x4 (v128.load64_zero (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2))))))
                (local.set $at (i32.add (local.get $acc) (i32.shl (local.get $j) (i32.const 3))))
                (v128.store (local.get $at) (f64x2.add (v128.load (local.get $at)) (f64x2.mul (local.get $a0) (local.get $bv))))
                (v128.store offset=2048 (local.get $at) (f64x2.add (v128.load offset=2048 (local.get $at)) (f64x2.mul (local.get $a1) (local.get $bv))))
                (v128.store offset=4096 (local.get $at) (f64x2.add (v128.load offset=4096 (local.get $at)) (f64x2.mul (local.get $a2) (local.get $bv))))
                (v128.store offset=6144 (local.get $at) (f64x2.add (v128.load offset=6144 (local.get $at)) (f64x2.mul (local.get $a3) (local.get $bv))))
                (local.set $j (i32.add (local.get $j) (i32.const 2)))
                (br $each_j)))
              ;; an odd last column
              (if (i32.lt_u (local.get $j) (local.get $jn))
                (then
                  (local.set $bs (f64.promote_f32 (f32.load (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2))))))
                  (local.set $at (i32.add (local.get $acc) (i32.shl (local.get $j) (i32.const 3))))
                  (f64.store (local.get $at) (f64.add (f64.load (local.get $at)) (f64.mul (local.get $s0) (local.get $bs))))
                  (f64.store offset=2048 (local.get $at) (f64.add (f64.load offset=2048 (local.get $at)) (f64.mul (local.get $s1) (local.get $bs))))
                  (f64.store offset=4096 (local.get $at) (f64.add (f64.load offset=4096 (local.get $at)) (f64.mul (local.get $s2) (local.get $bs))))
                  (f64.store offset=6144 (local.get $at) (f64.add (f64.load offset=6144 (local.get $at)) (f64.mul (local.get $s3) (local.get $bs))))))
              (local.set $p (i32.add (local.get $p) (i32.const 1)))
              (br $each_p))))
          (else
            ;; fewer than four rows left: one at a time
            (local.set $r (i32.const 0))
            (block $done_r (loop $each_r
              (br_if $done_r (i32.ge_u (local.get $r) (local.get $rows)))
              (local.set $row (i32.add (local.get $a) (i32.mul (i32.add (local.get $i0) (local.get $r)) (local.get $stride))))
              (local.set $p (i32.const 0))
              (block $done_p1 (loop $each_p1
                (br_if $done_p1 (i32.ge_u (local.get $p) (local.get $k)))
                (local.set $s0 (f64.promote_f32 (f32.load (i32.add (local.get $row) (i32.shl (local.get $p) (i32.const 2))))))
                (local.set $a0 (f64x2.splat (local.get $s0)))
                (local.set $brow (i32.add (local.get $b) (i32.shl (i32.add (i32.mul (local.get $p) (local.get $n)) (local.get $j0)) (i32.const 2))))
                (local.set $j (i32.const 0))
                (block $done_j1 (loop $each_j1
                  (br_if $done_j1 (i32.gt_u (i32.add (local.get $j) (i32.const 2)) (local.get $jn)))
                  (local.set $bv (f64x2.promote_low_f32x4 (v128.load64_zero (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2))))))
                  (local.set $at (i32.add (i32.add (local.get $acc) (i32.mul (local.get $r) (i32.const 2048))) (i32.shl (local.get $j) (i32.const 3))))
                  (v128.store (local.get $at) (f64x2.add (v128.load (local.get $at)) (f64x2.mul (local.get $a0) (local.get $bv))))
                  (local.set $j (i32.add (local.get $j) (i32.const 2)))
                  (br $each_j1)))
                (if (i32.lt_u (local.get $j) (local.get $jn))
                  (then
                    (local.set $bs (f64.promote_f32 (f32.load (i32.add (local.get $brow) (i32.shl (local.get $j) (i32.const 2))))))
                    (local.set $at (i32.add (i32.add (local.get $acc) (i32.mul (local.get $r) (i32.const 2048))) (i32.shl (local.get $j) (i32.const 3))))
                    (f64.store (local.get $at) (f64.add (f64.load (local.get $at)) (f64.mul (local.get $s0) (local.get $bs))))))
                (local.set $p (i32.add (local.get $p) (i32.const 1)))
                (br $each_p1)))
              (local.set $r (i32.add (local.get $r) (i32.const 1)))
              (br $each_r)))))
        ;; C's rows of this block, each sum rounded once to float32
        (local.set $r (i32.const 0))
        (block $done_out (loop $each_out
          (br_if $done_out (i32.ge_u (local.get $r) (local.get $rows)))
          (local.set $o (i32.add (local.get $c)
            (i32.shl (i32.add (i32.mul (i32.add (local.get $i0) (local.get $r)) (local.get $n)) (local.get $j0)) (i32.const 2))))
          (local.set $j (i32.const 0))
          (block $done_jo (loop $each_jo
            (br_if $done_jo (i32.ge_u (local.get $j) (local.get $jn)))
            (f32.store (i32.add (local.get $o) (i32.shl (local.get $j) (i32.const 2)))
              (f32.demote_f64 (f64.load (i32.add (i32.add (local.get $acc) (i32.mul (local.get $r) (i32.const 2048))) (i32.shl (local.get $j) (i32.const 3))))))
            (local.set $j (i32.add (local.get $j) (i32.const 1)))
            (br $each_jo)))
          (local.set $r (i32.add (local.get $r) (i32.const 1)))
          (br $each_out)))
        (local.set $i0 (i32.add (local.get $i0) (i32.const 4)))
        (br $each_i0)))
      (local.set $j0 (i32.add (local.get $j0) (i32.const 256)))
      (br $each_j0)))))
