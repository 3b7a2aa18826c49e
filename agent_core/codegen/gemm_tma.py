"""The sm_90 main loop of the tile GEMM (codegen/gemm_mma.py with params["mma"] = "tma"): warp-specialised,
TMA copies, wgmma with A's fragments in registers and B in shared memory, split TF32 inside the kernel.

Why: cuBLAS reaches its split TF32 only over parts split beforehand into HBM (three products' operands
concatenated along K); here the parts never leave the SM. The tensor cores read each wgmma's shared
operands at a fixed rate per product, so shared-memory traffic sets the pace: with both operands in
shared memory (the first form of this loop, 1.41 ms at 4096^3 on an H100) A's hi and lo were written
there and read back by every product; read into registers once a slice instead, 1.10 ms
(benchmarks/h100-2026-12-06-s21, tools/tma_variants.py): 0.87x cuBLAS's TF32 GEMM over the concatenated
parts alone, 1.00x of that library form as a run calls it, the input's split included
(tools/bench_tile_gemm.py --only square: 1.063 against 1.065 ms).

How:
- 512 threads: two producer warpgroups and two consumer warpgroups of 64 output rows each (block_m 128);
- a ring of `stages` k slices of 32 (one 128-byte row per operand row, the 128-byte swizzle the wgmma
  descriptors read). One producer thread copies each slice of A (block_m rows) and B (block_n rows) as
  soon as its stage is free, two TMA copies counted by the slice's `landed` mbarrier (tensor maps the
  runtime encodes from the bound tensors: runtime/tensor_map.py); rows past M / N and k past K arrive
  as zeros;
- the other seven producer warps split B's rows: hi is the copy itself (the tensor cores read a TF32
  operand's top 19 bits), lo = x less those bits, rounded, written to the stage's lo part (measured
  against hi rounded in place as well: 1.098 against 1.116 ms at 4096^3, error against float64 2.4e-6
  against 2.0e-6, torch fp32's 7.5e-6); then they arrive on the slice's `full` barrier;
- each consumer warp reads its 16 rows of A's slice through the swizzle into m16n8k8's A layout and
  splits them in registers, then its warpgroup issues a_lo b_hi, a_hi b_lo, a_hi b_hi per 8-wide k step
  (12 wgmma m64nNk8 a slice). `sum_slices` slices (2) are summed on the tensor cores, then added to the
  running sums in fp32 (one running tensor-core sum over a long K errs past 1e-4 at K = 8192), and their
  stages freed (`empty`) for the copying warp;
- the accumulators have mma.sync's m16n8 fragment layout per warp (warp w of the consumers owns rows
  16 w .. 16 w + 15), so the tile GEMM's epilogue reads them unchanged.

Takes one 2-D GEMM whose A rows and B rows (linear's [N, K] weight) are k-contiguous with 16-byte row
strides, its pointwise epilogue, and row reductions and normalising ops after it (their combine
synchronises the consumers through a named barrier, cta_sync; the CTAs of a row tile share the rows as
one thread-block cluster, up to 8 of them, else through the workspace: gemm_mma.row_cluster), and K cut
into parts where the output has few tiles (one cluster per tile adding up the parts' sums, or, with row
reductions after it, the parts taking turns through the workspace); stacks, convolutions and gated units
stay on the mma.sync loop.
"""
from __future__ import annotations

from .kernel import CodegenError

MMA = "tma"
# Whether the tuner tries these tiles on sm_90 (the region's alternatives, gemm_mma.tma_alternatives, kept by
# agent/tune.tune_space). On: on an H100 they verified everywhere and took 28_VisionTransformer from 1.22x to
# 1.28x and GEMM + GELU + row logsumexp from 0.62x to 0.92x (benchmarks/h100-2026-12-06-s20).
IN_TUNER = True
PRODUCERS = 256            # threads of the two producer warpgroups
BK = 32                    # k per slice: one 128-byte swizzle row per operand row
MAX_PARTS = 8              # split-K parts: one thread-block cluster of the portable size
LOCALS = ("hi", "lo", "full", "empty", "landed", "it", "it0", "u", "ks", "pt", "h4", "l4", "x4", "ar", "c1", "a_hi",
          "a_lo", "load_a", "smem_raw", "map_a", "map_b", "u64")


def tried_on(arch: str) -> bool:
    return IN_TUNER and arch == "sm_90"


def applies(spec) -> str | None:
    """Why this loop cannot run the GEMM `spec` (None where it can)."""
    if spec.conv is not None or spec.batch > 1 or spec.halves:
        return "a convolution, a stack of GEMMs or a gated unit runs on the mma.sync loop"
    if spec.a.col_stride != 1 or spec.a.row_stride % 4:
        return "A's rows are not k-contiguous with 16-byte strides (a TMA copy's)"
    if not spec.b_k_contiguous or spec.b.col_stride % 4:
        return "B is not a k-contiguous [N, K] matrix with 16-byte row strides (the tensor cores read TF32 k-major)"
    return None


def variants(p: dict) -> list[dict]:
    """The tiles to try, most promising first: 128 x 128 in 4 stages, 128 x 64 in 6 (twice the CTAs)."""
    base = {"mma": MMA, "block_m": 128, "warps_m": 8, "warps_n": 1, "block_k": BK, "split_k": 1, "sum_slices": 2}
    return [{**p, **base, "block_n": 128, "stages": 4}, {**p, **base, "block_n": 64, "stages": 6}]


def slices_per_sum(p: dict) -> int:
    """k slices summed on the tensor cores before each fp32 add."""
    return int(p.get("sum_slices") or 1)


def check(spec, p: dict) -> None:
    bm, bn, bk = int(p["block_m"]), int(p["block_n"]), int(p["block_k"])
    why = applies(spec)
    if why:
        raise CodegenError(f"tile GEMM (tma): {why}")
    if bm != 128 or int(p["warps_m"]) != 8 or int(p["warps_n"]) != 1:
        raise CodegenError(f"tile GEMM (tma): block_m {bm} of {p['warps_m']} x {p['warps_n']} warps: two consumer "
                           "warpgroups of 64 rows each (block_m 128, warps_m 8, warps_n 1)")
    if bn % 8 or not 8 <= bn <= 128:
        raise CodegenError(f"tile GEMM (tma): block_n {bn} must be a multiple of 8 up to 128")
    if bk != BK:
        raise CodegenError(f"tile GEMM (tma): block_k {bk}: a slice is one 128-byte row ({BK} floats)")
    if slices_per_sum(p) not in (1, 2):    # 4 leaves too few registers: ptxas serialises the products
        raise CodegenError(f"tile GEMM (tma): {p['sum_slices']} slices per tensor-core sum (1 or 2)")
    parts = int(p.get("split_k") or 1)
    if parts > 1 and (parts > MAX_PARTS or (bn // 8) % parts):
        raise CodegenError(f"tile GEMM (tma): K in {parts} parts: at most {MAX_PARTS} (one cluster), dividing the "
                           f"tile's {bn // 8} fragment columns")
    if p.get("portable") or p.get("tf32"):
        raise CodegenError("tile GEMM (tma): no one-TF32-product form or CPU emulation")


def shared_bytes(bm: int, bn: int, stages: int) -> int:
    """Each stage's slices and B's lo part (A's are split in registers), three mbarriers a stage, room to
    align to the swizzle's 1024 bytes."""
    return stages * (bm + 2 * bn) * BK * 4 + 3 * stages * 8 + 1024


def consts(p: dict) -> list[str]:
    """The loop's constants for the kernel's preamble."""
    return [f"constexpr int kProducers = {PRODUCERS};   // threads copying (one warp) and splitting slices",
            "constexpr int kSlice = (kBM + kBN) * kBK;   // floats of one k slice of A and B",
            "constexpr int kLoAt = kBM * kBK;   // where in a slice the producers' split starts: B's rows",
            "constexpr int kLoSlice = kBN * kBK;   // floats of one stage's lo parts",
            f"constexpr int kSums = {slices_per_sum(p)};   // k slices per tensor-core sum"]


def tensor_maps(spec, inputs: list[str], bm: int, bn: int) -> list[dict]:
    """The TMA copies' tensor maps, in the kernel's parameter order: A's rows and B's rows, each a 2-D
    [rows, K] fp32 matrix with its row stride, copied in boxes of (block rows) x 32."""
    return [{"input": inputs.index(spec.a.value), "rows": spec.M, "cols": spec.K, "row_stride": spec.a.row_stride,
             "box_rows": bm, "box_cols": BK},
            {"input": inputs.index(spec.b.value), "rows": spec.N, "cols": spec.K, "row_stride": spec.b.col_stride,
             "box_rows": bn, "box_cols": BK}]


PARAMS = ["const __grid_constant__ TmaMap map_a", "const __grid_constant__ TmaMap map_b"]


def helpers(bn: int) -> list[str]:
    n = bn // 2          # accumulators per thread: 64 x bn over 128 threads
    dregs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return [
        "typedef unsigned long long u64;",
        "struct __align__(64) TmaMap { u64 v[16]; };   // a CUtensorMap, passed by value",
        "__device__ __forceinline__ unsigned s32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }",
        "__device__ __forceinline__ void mbar_init(u64* b, unsigned count) {",
        '  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(b)), "r"(count) : "memory");',
        "}",
        "__device__ __forceinline__ void mbar_expect(u64* b, unsigned bytes) {",
        '  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s32(b)), "r"(bytes) : "memory");',
        "}",
        "__device__ __forceinline__ void mbar_arrive(u64* b) {",
        '  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(s32(b)) : "memory");',
        "}",
        "__device__ __forceinline__ void mbar_wait(u64* b, unsigned parity) {",
        "  unsigned ok = 0;",
        "  while (!ok)",
        '    asm volatile("{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n'
        'selp.u32 %0, 1, 0, p;\\n}" : "=r"(ok) : "r"(s32(b)), "r"(parity) : "memory");',
        "}",
        "// a box of the tensor map's matrix at (k, row) into shared memory, counted by bar's transaction bytes",
        "__device__ __forceinline__ void tma_copy(float* dst, const TmaMap* map, u64* bar, int k, int row) {",
        '  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes '
        '[%0], [%1, {%2, %3}], [%4];"',
        '               :: "r"(s32(dst)), "l"(map), "r"(k), "r"(row), "r"(s32(bar)) : "memory");',
        "}",
        "// generic-proxy stores to shared memory made visible to the async proxy that wgmma reads through",
        '__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory"); }',
        '__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }',
        '__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }',
        '__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory"); }',
        "// registers the compiler must not move across the wgmma wait (the products read and write them until it)",
        '__device__ __forceinline__ void hold(float& x) { asm volatile("" : "+f"(x) :: "memory"); }',
        "// a K-major operand in shared memory, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart",
        "__device__ __forceinline__ u64 wgmma_desc(const float* p) {",
        "  const u64 a = s32(p);",
        "  return ((a & 0x3FFFFull) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);",
        "}",
        "// hi: x itself (the tensor cores read its top 19 bits); lo: x less those, rounded to TF32",
        "__device__ __forceinline__ float trunc_lo(float x) {",
        "  const float l = x - __uint_as_float(__float_as_uint(x) & 0xffffe000u);",
        "  return __uint_as_float(__float_as_uint(l) + 0x1000u);",
        "}",
        f"// d (64 x {bn} per warpgroup) = a (64 x 8) * b (8 x {bn}) + (scale_d ? d : 0), TF32: a in registers",
        "// (this warp's 16 rows in m16n8k8's A layout), b in shared memory",
        "__device__ __forceinline__ void wgmma_rs(float* d, const unsigned* a, u64 b, int scale_d) {",
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{n + 5}, 0;\\n"',
        f'               "wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 {{{dregs}}}, '
        f'{{%{n}, %{n + 1}, %{n + 2}, %{n + 3}}}, %{n + 4}, p, 1, 1;\\n}}\\n"',
        f"               : {outs}",
        '               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));',
        "}",
    ]


def kernel_lines(grouped_tile: list[str], rows: bool, p: dict) -> list[str]:
    """C lines of the kernel body up to the consumers' accumulators (`acc[0][nt][j]`), with the names the
    epilogue reads (tid, lane_g, lane_t, warp_m, warp_n, bm, bn; with rows, smem) set for the consumer
    threads; the producers leave once their last slice is split. Measured and not kept (H100,
    benchmarks/h100-2026-12-06-s22/tma_variants.txt; 4096^3 in 1.089 ms this way): two sets of A's
    fragments in turn, each slice's products left in flight (wgmma.wait_group 1), 1.108 ms at 2 slices a
    sum and 1.343 at 4 (ptxas serialises them); the second consumer warpgroup's sums ending half a sum
    later, 1.132."""
    parts = int(p.get("split_k") or 1)
    return [
        "  extern __shared__ __align__(1024) unsigned char smem_raw[];",
        "  // [kStages][kBM + kBN][32]: the copied slices, A's rows then B's (B's hi: the copy itself); then the",
        "  // lo parts of B's rows the producers write, [kStages][kLoSlice]",
        "  float* hi = reinterpret_cast<float*>(smem_raw + ((1024u - (s32(smem_raw) & 1023u)) & 1023u));",
        "  float* lo = hi + kStages * kSlice;",
        "  u64* full = reinterpret_cast<u64*>(lo + kStages * kLoSlice);   // a slice is split: the products may read it",
        "  u64* empty = full + kStages;                                   // its products are done: it may be refilled",
        "  u64* landed = empty + kStages;                                 // its copies have landed",
        *grouped_tile,
        "  const int bm = tile_m * kBM, bn = tile_n * kBN;",
        *(["  // split K: this CTA's part of the reduction, k slices [kt0, kt0 + KT)",
           f"  const int kSlices = (kK + kBK - 1) / kBK, kPer = (kSlices + {parts} - 1) / {parts};",
           "  const int kt0 = blockIdx.z * kPer, KT = max(0, min(kPer, kSlices - kt0));"] if parts > 1 else
          ["  const int kt0 = 0, KT = (kK + kBK - 1) / kBK;"]),
        "  if (threadIdx.x == 0) {",
        "    for (int s = 0; s < kStages; ++s) {",
        "      mbar_init(&full[s], kProducers - 32); mbar_init(&empty[s], kBM / 64); mbar_init(&landed[s], 1);",
        "    }",
        '    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");',
        "  }",
        "  __syncthreads();",
        "  if (threadIdx.x < kProducers) {",
        '    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\\n");',
        "    if (threadIdx.x < 32) {         // the copying warp: each slice as soon as its stage is free",
        "      if (threadIdx.x == 0)",
        "        for (int it = 0; it < KT; ++it) {",
        "          const int s = it % kStages;",
        "          if (it >= kStages) mbar_wait(&empty[s], ((it / kStages) - 1) & 1);",
        "          mbar_expect(&landed[s], kSlice * 4);",
        "          tma_copy(hi + s * kSlice, &map_a, &landed[s], (kt0 + it) * kBK, bm);",
        "          tma_copy(hi + s * kSlice + kBM * kBK, &map_b, &landed[s], (kt0 + it) * kBK, bn);",
        "        }",
        "      return;",
        "    }",
        "    const int pt = threadIdx.x - 32;   // the splitting warps: B's rows",
        "    for (int it = 0; it < KT; ++it) {",
        "      const int s = it % kStages;",
        "      mbar_wait(&landed[s], (it / kStages) & 1);",
        "      float4* h4 = reinterpret_cast<float4*>(hi + s * kSlice);",
        "      float4* l4 = reinterpret_cast<float4*>(lo + s * kLoSlice);",
        "      for (int e = kLoAt / 4 + pt; e < kSlice / 4; e += kProducers - 32) {   // B's rows: lo beside them",
        "        const float4 x4 = h4[e];",
        "        l4[e - kLoAt / 4] = make_float4(trunc_lo(x4.x), trunc_lo(x4.y), trunc_lo(x4.z), trunc_lo(x4.w));",
        "      }",
        "      fence_proxy_async();          // the split, visible to the tensor cores",
        "      mbar_arrive(&full[s]);",
        "    }",
        "    return;",
        "  }",
        '  asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\\n");',
        "  const int tid = threadIdx.x - kProducers, lane_g = (tid & 31) >> 2, lane_t = tid & 3;",
        "  const int warp_m = tid >> 5, warp_n = 0;   // warp m owns rows 16 m .. 16 m + 15",
        *(["  float* const smem = hi;   // the epilogue's scratch once every slice is consumed"]
          if rows or parts > 1 else []),
        "  float acc[1][kNT][4], sacc[1][kNT][4];",
        "  unsigned a_hi[kSums][kBK / 8][4], a_lo[kSums][kBK / 8][4];   // the A fragments of the slices in flight",
        "  // slice it's A fragments for this warp (m16n8k8's layout), read through the 128-byte swizzle and split",
        "  auto load_a = [&](int it, unsigned (&ah)[kBK / 8][4], unsigned (&al)[kBK / 8][4]) {",
        "    mbar_wait(&full[it % kStages], (it / kStages) & 1);",
        "    const float* ar = hi + (it % kStages) * kSlice + (warp_m * 16 + lane_g) * kBK + lane_t;",
        "    #pragma unroll",
        "    for (int ks = 0; ks < kBK / 8; ++ks) {   // k 8 ks + lane_t and + 4: 16-byte chunks 2 ks, 2 ks + 1",
        "      const int c0 = ((2 * ks) ^ lane_g) * 4, c1 = ((2 * ks + 1) ^ lane_g) * 4;   // swizzled by row % 8",
        "      split_tf32(ar[c0], ah[ks][0], al[ks][0]); split_tf32(ar[8 * kBK + c0], ah[ks][1], al[ks][1]);",
        "      split_tf32(ar[c1], ah[ks][2], al[ks][2]); split_tf32(ar[8 * kBK + c1], ah[ks][3], al[ks][3]);",
        "    }",
        "  };",
        "  #pragma unroll",
        "  for (int nt = 0; nt < kNT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.0f;",
        "  for (int it0 = 0; it0 < KT; it0 += kSums) {   // kSums slices summed on the tensor cores, then in fp32",
        "    #pragma unroll",
        "    for (int u = 0; u < kSums; ++u) {",
        "      const int it = it0 + u, s = it % kStages;",
        "      if (it >= KT) break;",
        "      load_a(it, a_hi[u], a_lo[u]);",
        "      const float* bh = hi + s * kSlice + kBM * kBK;   // B's rows as copied (hi), lo in the stage's lo part",
        "      const float* bl = lo + s * kLoSlice;",
        "      wgmma_fence();",
        "      #pragma unroll",
        "      for (int ks = 0; ks < kBK / 8; ++ks) {   // small products first; the group's first overwrites the sums",
        "        wgmma_rs(&sacc[0][0][0], a_lo[u][ks], wgmma_desc(bh + ks * 8), u == 0 && ks == 0 ? 0 : 1);",
        "        wgmma_rs(&sacc[0][0][0], a_hi[u][ks], wgmma_desc(bl + ks * 8), 1);",
        "        wgmma_rs(&sacc[0][0][0], a_hi[u][ks], wgmma_desc(bh + ks * 8), 1);",
        "      }",
        "      wgmma_commit();",
        "    }",
        "    wgmma_wait();",
        "    #pragma unroll",
        "    for (int nt = 0; nt < kNT; ++nt)",
        "      #pragma unroll",
        "      for (int j = 0; j < 4; ++j) { hold(sacc[0][nt][j]); acc[0][nt][j] += sacc[0][nt][j]; }",
        "    if ((tid & 127) == 0)   // this warpgroup's products of the slices are done: the stages may refill",
        "      for (int it = it0; it < it0 + kSums && it < KT; ++it) mbar_arrive(&empty[it % kStages]);",
        "  }",
    ]
