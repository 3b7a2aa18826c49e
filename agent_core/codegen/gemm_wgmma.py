"""The sm_90 main loop of the tile GEMM (codegen/gemm_mma.py with params["mma"] = "wgmma"): Hopper's
warpgroup MMA (wgmma.mma_async m64nNk8, TF32) in place of mma.sync m16n8k8.

Why: mma.sync reaches about half of an H100's TF32 tensor-core rate; split TF32 needs three products per
step, so our mma.sync GEMM ran at half the speed of cuBLAS's three TF32 calls (4096^3: 2.38 ms against
1.12 ms, benchmarks/h100-2026-12-05-s15). wgmma is the instruction cuBLAS itself uses on Hopper.

How, keeping everything else of the tile GEMM (its copies, its epilogue and row reductions):
- a warpgroup (4 warps) owns 64 rows of the block tile and all block_n columns; its accumulators have
  mma.sync's m16n8 fragment layout per warp, so the epilogue reads them as a 16 x block_n warp tile;
- A (the activations) is split into hi / lo TF32 in registers as before and fed to wgmma from registers;
- B's slice is split once per block into hi and lo in shared memory, in the 128-byte-swizzled K-major
  layout the wgmma descriptors read (32 TF32 values per 128-byte row, the 16-byte chunks of row n
  permuted by n mod 8): where B's rows are k-contiguous and 16-byte aligned, cp.async copies them
  straight into that layout and the split writes hi in place and lo into one of two more slices; else a
  padded staging tile is split into two hi / lo pairs. The split of slice k + 1, and the read of its A
  fragments into a second set of registers, run while the tensor cores work on slice k;
- a_lo b_hi + a_hi b_lo + a_hi b_hi per 8-wide k step, the slice's sum added to the running sums in fp32
  (slice_acc), as the mma.sync loop does.

params["portable"] swaps in plain C++ helpers (portable_helpers) that read B through the descriptor and
the swizzle as the hardware does, so the CPU emulator checks this body (tests/test_gemm_wgmma.py).
"""
from __future__ import annotations

from .kernel import CodegenError

MMA = "wgmma"
# Whether the tuner tries these tiles on sm_90. Off: on an H100 (0ffa1f4, benchmarks/h100-2026-12-06-s18)
# every form matches torch (tests/gpu/test_gemm_wgmma_gpu.py: 17 of 18, the 18th the 256-column plain
# sums erring past 1e-4 at K = 8192, which verification rejects), and the 256-column tile is 13-18%
# faster than the best mma.sync tile on 4096^3 and 8192^3 (2.07 against 2.34 ms), but still about half of
# cuBLAS's split TF32 (1.10 ms), so the agent would keep the library form anyway and the tuner would pay
# three more compiles a GEMM region for nothing. Each slice waits for its products before the next is
# issued (wait_group 0) and every block splits its B slice again: those are what to fix first.
# tools/bench_tile_gemm.py --wgmma times them regardless.
IN_TUNER = False
LOCALS = ("Bw", "Bl", "split_b", "load_a", "hi", "lo", "at", "ks", "h", "l", "n", "k", "gn", "gk", "nh", "nl")


def tried_on(arch: str) -> bool:
    """Whether the tuner tries the wgmma tiles for a GPU of this sm_XY."""
    return IN_TUNER and arch == "sm_90"


def variants(p: dict) -> list[dict]:
    """The wgmma tiles to try for a GEMM whose mma.sync params are p (its form; its tiles where given),
    most promising first: 128 rows of 2 warpgroups by p's columns (up to 128) in 4 stages; one warpgroup
    of 64 rows in 2 stages (85 KB and about 220 registers a thread at 128 columns: two CTAs share an SM);
    where p has 128 columns, 256 of them (its sums without the per-slice accumulators, which would not
    fit in registers), else 64 rows of p's columns in 3 stages."""
    bn = min(128, -(-int(p.get("block_n") or 128) // 8) * 8)
    base = {"mma": MMA, "block_m": 128, "warps_m": 8, "warps_n": 1, "block_n": bn, "block_k": 32, "stages": 4}
    out = [base, {**base, "block_m": 64, "warps_m": 4, "stages": 2},
           {**base, "block_n": 256, "slice_acc": False, "stages": 3} if bn == 128 else
           {**base, "block_m": 64, "warps_m": 4, "stages": 3}]
    return [{**p, **v} for v in out]


def check(bm: int, bn: int, bk: int, wm: int, wn: int) -> None:
    if wn != 1 or wm * 16 != bm or bm % 64 or not 64 <= bm <= 256:
        raise CodegenError(f"tile GEMM (wgmma): {bm} rows of {wm} x {wn} warps: warpgroups of 4 warps own 64 rows "
                           f"each and all columns (warps_m = block_m / 16, warps_n = 1)")
    if bn % 8 or not 8 <= bn <= 256:
        raise CodegenError(f"tile GEMM (wgmma): block_n {bn} must be a multiple of 8 up to 256")
    if bk % 32:
        raise CodegenError(f"tile GEMM (wgmma): block_k {bk} must hold whole 128-byte rows (32 TF32 values)")


DESC = [
    "// a K-major operand in shared memory, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart",
    "__device__ __forceinline__ unsigned long long wgmma_desc(const float* p) {",
    "  const unsigned long long a = (unsigned)__cvta_generic_to_shared(p);",
    "  return ((a & 0x3FFFFull) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);",
    "}",
]


def helpers(bn: int, portable: bool = False) -> list[str]:
    """The wgmma helpers for block_n = bn; portable: plain C++ of the same names for the CPU emulator."""
    if portable:
        return portable_helpers(bn)
    n = bn // 2          # accumulators per thread: 64 x bn over 128 threads
    dregs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return [
        "__device__ __forceinline__ void wgmma_fence() { asm volatile(\"wgmma.fence.sync.aligned;\\n\" ::: \"memory\"); }",
        "__device__ __forceinline__ void wgmma_commit() { asm volatile(\"wgmma.commit_group.sync.aligned;\\n\" ::: \"memory\"); }",
        "__device__ __forceinline__ void wgmma_wait() { asm volatile(\"wgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\"); }",
        "// generic-proxy stores to shared memory made visible to the async proxy that wgmma reads through",
        "__device__ __forceinline__ void fence_proxy_async() { asm volatile(\"fence.proxy.async.shared::cta;\\n\" ::: \"memory\"); }",
        "// registers the compiler must not move across the wgmma wait (the products read and write them until it)",
        "__device__ __forceinline__ void hold(float& x) { asm volatile(\"\" : \"+f\"(x) :: \"memory\"); }",
        "__device__ __forceinline__ void hold_u(unsigned& x) { asm volatile(\"\" : \"+r\"(x) :: \"memory\"); }",
        *DESC,
        f"// d (64 x {bn} per warpgroup) += a (64 x 8, TF32 in registers) * b (8 x {bn}, TF32 in shared memory)",
        "__device__ __forceinline__ void wgmma_tf32(float* d, const unsigned* a, unsigned long long b, int scale_d) {",
        "  asm volatile(\"{\\n.reg .pred p;\\n\"",
        f"               \"setp.ne.b32 p, %{n + 5}, 0;\\n\"",
        f"               \"wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 {{{dregs}}}, "
        f"{{%{n}, %{n + 1}, %{n + 2}, %{n + 3}}}, %{n + 4}, p, 1, 1;\\n}}\\n\"",
        f"               : {outs}",
        "               : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(b), \"r\"(scale_d));",
        "}",
    ]


def portable_helpers(bn: int) -> list[str]:
    """wgmma_tf32 and its fences in plain C++ (writer/emulate.py runs them): the product reads A from the
    warpgroup's threads in the register layout above and B through the descriptor as the hardware does
    (the 14-bit address and stride fields, the 128-byte swizzle: byte address bits 4-6 XOR bits 7-9), so
    the descriptors, the swizzled writes and every fragment index are checked on the CPU. It completes
    at once: fence, commit and wait do nothing. Every warpgroup issues its products at the same point of
    the loop, so the A registers are exchanged through a block barrier."""
    return [
        "__device__ __forceinline__ void wgmma_fence() {}",
        "__device__ __forceinline__ void wgmma_commit() {}",
        "__device__ __forceinline__ void wgmma_wait() {}",
        "__device__ __forceinline__ void fence_proxy_async() {}",
        "__device__ __forceinline__ void hold(float&) {}",
        "__device__ __forceinline__ void hold_u(unsigned&) {}",
        "__device__ __forceinline__ unsigned __cvta_generic_to_shared(const void* p) {",
        "  return (unsigned)(reinterpret_cast<const unsigned char*>(p) - stitch_emu::dynamic_shared);",
        "}",
        *DESC,
        "__device__ __forceinline__ void wgmma_tf32(float* d, const unsigned* a, unsigned long long b, int scale_d) {",
        "  __shared__ unsigned wg_a[512][4];   // every thread's A registers",
        "  const int tid = threadIdx.x, wg = tid & ~127, w = (tid & 127) >> 5, g = (tid & 31) >> 2, t = tid & 3;",
        "  for (int i = 0; i < 4; ++i) wg_a[tid][i] = a[i];",
        "  __syncthreads();",
        "  const unsigned start = (unsigned)(b & 0x3FFFull) << 4, stride = (unsigned)((b >> 32) & 0x3FFFull) << 4;",
        f"  for (int nt = 0; nt < {bn // 8}; ++nt)",
        "    for (int j = 0; j < 4; ++j) {",
        "      const int r = w * 16 + g + (j >> 1) * 8, c = nt * 8 + 2 * t + (j & 1);",
        "      float sum = 0.0f;",
        "      for (int k = 0; k < 8; ++k) {",
        "        // A[r][k]: lane 4 (r % 8) + k % 4 of warp r / 16, register (r % 16) / 8 + 2 (k / 4)",
        "        const unsigned av = wg_a[wg + (r >> 4) * 32 + (r & 7) * 4 + (k & 3)][((r & 15) >> 3) + 2 * (k >> 2)];",
        "        unsigned addr = start + (c >> 3) * stride + (c & 7) * 128 + k * 4;",
        "        addr ^= ((addr >> 7) & 7) << 4;",
        "        const unsigned bv = *reinterpret_cast<const unsigned*>(stitch_emu::dynamic_shared + addr);",
        "        sum += __uint_as_float(av & 0xffffe000u) * __uint_as_float(bv & 0xffffe000u);",
        "      }",
        "      d[nt * 4 + j] = (scale_d ? d[nt * 4 + j] : 0.0f) + sum;",
        "    }",
        "  __syncthreads();",
        "}",
    ]


SWIZZLED = "(k >> 5) * (kBN * 32) + n * 32 + ((((k >> 2) & 7) ^ (n & 7)) << 2) + (k & 3)"   # (n, k) in a slice


def shared_bytes(bm: int, bn: int, bk: int, stages: int, staged_b_tile: int | None) -> int:
    """A's staging tiles; B's slices: copied straight into the swizzled layout (staged_b_tile None: their
    hi is written in place, lo into two more) or staged padded (floats per stage) and split into two
    hi / lo pairs; room to align the swizzled ones to the swizzle's 1024 bytes."""
    a = 4 * stages * bm * (bk + 4)
    b = 4 * (stages + 2) * bn * bk if staged_b_tile is None else 4 * stages * staged_b_tile + 16 * bn * bk
    return a + b + 1024


def copy_lines(src: str, row_stride: int, indent: str, n_at: str = "bn + {}") -> list[str]:
    """C lines: B's slice (tile row n is B's row n_at.format(n), k contiguous, 16-byte aligned) into the
    stage's swizzled layout with 16-byte cp.async copies: chunk c of row n lands at chunk c ^ (n mod 8)
    of its 128-byte row."""
    return [f"{indent}for (int e = tid; e < kBN * kBK / 4; e += kBlock) {{",
            f"{indent}  const int n = e / (kBK / 4), k = (e % (kBK / 4)) * 4, gn = {n_at.format('n')}, gk = k0 + k;",
            f"{indent}  const bool ok = gn < kN && gk < kK;",
            f"{indent}  cp_async16(Bs + stage * kBTile + {SWIZZLED}, ok ? {src} + ((long long)gn * {row_stride} + gk) "
            f": {src}, ok);",
            f"{indent}}}"]


def smem_lines(in_place: bool) -> list[str]:
    """C lines: the shared buffers, B's swizzled ones first at a 1024-byte boundary."""
    align = "  float* Bw = smem + ((1024u - ((unsigned)__cvta_generic_to_shared(smem) & 1023u)) & 1023u) / 4;"
    if in_place:
        return ["  extern __shared__ __align__(16) float smem[];",
                "  // B's slices [kStages][kBK / 32][kBN][32] (hi in place once split), then two of lo, 1024-byte aligned",
                align,
                "  float* Bs = Bw;",
                "  float* Bl = Bw + kStages * kBTile;",
                "  float* As = Bl + 2 * kBTile;                 // [kStages][kBM][kAS]"]
    return ["  extern __shared__ __align__(16) float smem[];",
            "  // [2 slices][hi, lo][kBK / 32][kBN][32], at the 128-byte swizzle's 1024-byte period",
            align,
            "  float* As = Bw + 4 * kBN * kBK;               // [kStages][kBM][kAS]",
            "  float* Bs = As + kStages * kATile;           // [kStages][kBN][kBS] or [kStages][kBK][kBS]"]


def main_loop(kb: bool, slice_acc: bool, in_place: bool) -> list[str]:
    """C lines after the pipeline's first copies (gemm_mma.PIPELINE_START) to the accumulators' final
    values (`acc[0][nt][j]`)."""
    sums = "sacc" if slice_acc else "acc"
    if in_place:      # the stage holds the swizzled slice: hi over it, lo beside
        split = ["    float* hi = Bs + (slice % kStages) * kBTile;",
                 "    float* lo = Bl + (slice & 1) * kBTile;",
                 "    for (int e = tid; e < kBN * kBK; e += kBlock) {",
                 "      const int n = e / kBK, k = e % kBK;",
                 f"      const int at = {SWIZZLED};",
                 "      unsigned h, l;",
                 "      split_tf32(hi[at], h, l);"]
        where = ["    const float* hi = Bs + (kt % kStages) * kBTile;",
                 "    const float* lo = Bl + (kt & 1) * kBTile;"]
    else:
        pick = ("const int n = e / kBK, k = e % kBK;", "Bt[n * kBS + k]") if kb else \
               ("const int k = e / kBN, n = e % kBN;", "Bt[k * kBS + n]")
        split = ["    const float* Bt = Bs + (slice % kStages) * kBTile;",
                 "    float* hi = Bw + (slice & 1) * 2 * kBN * kBK;",
                 "    float* lo = hi + kBN * kBK;",
                 "    for (int e = tid; e < kBN * kBK; e += kBlock) {",
                 f"      {pick[0]}",
                 f"      const int at = {SWIZZLED};",
                 "      unsigned h, l;",
                 f"      split_tf32({pick[1]}, h, l);"]
        where = ["    const float* hi = Bw + (kt & 1) * 2 * kBN * kBK;",
                 "    const float* lo = hi + kBN * kBK;"]
    return [
        "  float acc[1][kNT][4];",
        "  #pragma unroll",
        "  for (int nt = 0; nt < kNT; ++nt) acc[0][nt][0] = acc[0][nt][1] = acc[0][nt][2] = acc[0][nt][3] = 0.0f;",
        *(["  float sacc[1][kNT][4] = {};"] if slice_acc else []),
        "  auto split_b = [&](int slice) {   // B's slice -> hi / lo TF32, swizzled K-major, for the descriptors",
        *split,
        "      hi[at] = __uint_as_float(h);",
        "      lo[at] = __uint_as_float(l);",
        "    }",
        "    fence_proxy_async();",
        "  };",
        "  // this warp's A fragments of a slice, split into hi / lo (the hardware's m16n8k8 A layout per warp)",
        "  auto load_a = [&](int slice, unsigned (&h)[kBK / 8][4], unsigned (&l)[kBK / 8][4]) {",
        "    const float* At = As + (slice % kStages) * kATile;",
        "    #pragma unroll",
        "    for (int ks = 0; ks < kBK / 8; ++ks) {",
        "      const float* pa = At + (warp_m * 16 + lane_g) * kAS + ks * 8 + lane_t;",
        "      split_tf32(pa[0], h[ks][0], l[ks][0]); split_tf32(pa[8 * kAS], h[ks][1], l[ks][1]);",
        "      split_tf32(pa[4], h[ks][2], l[ks][2]); split_tf32(pa[8 * kAS + 4], h[ks][3], l[ks][3]);",
        "    }",
        "  };",
        "  unsigned ah[kBK / 8][4], al[kBK / 8][4], nh[kBK / 8][4], nl[kBK / 8][4];   // this slice's, the next's",
        "  cp_async_wait<kStages - 2>();",
        "  __syncthreads();",
        "  split_b(0);",
        "  load_a(0, ah, al);",
        "  __syncthreads();",
        "  for (int kt = 0; kt < KT; ++kt) {",
        "    // the slot of slice kt - 1: its A is in registers, its B read by finished products (last barrier)",
        "    if (kt + kStages - 1 < KT) load_tile(kt + kStages - 1, (kt + kStages - 1) % kStages);",
        "    cp_async_commit();              // (an empty group at the tail keeps the count)",
        *where,
        "    wgmma_fence();",
        "    #pragma unroll",
        "    for (int ks = 0; ks < kBK / 8; ++ks) {",
        "      const int at = (ks >> 2) * (kBN * 32) + (ks & 3) * 8;   // k step ks: its 128-byte row, 32 bytes on",
        f"      wgmma_tf32(&{sums}[0][0][0], al[ks], wgmma_desc(hi + at), {'ks > 0' if slice_acc else '1'});",
        f"      wgmma_tf32(&{sums}[0][0][0], ah[ks], wgmma_desc(lo + at), 1);",
        f"      wgmma_tf32(&{sums}[0][0][0], ah[ks], wgmma_desc(hi + at), 1);",
        "    }",
        "    wgmma_commit();",
        "    cp_async_wait<kStages - 2>();    // slice kt + 1 has landed ...",
        "    __syncthreads();                 // ... for every thread",
        "    if (kt + 1 < KT) {               // while the tensor cores work on slice kt: slice kt + 1's B split,",
        "      split_b(kt + 1);               // its A fragments read",
        "      load_a(kt + 1, nh, nl);",
        "    }",
        "    wgmma_wait();",
        "    #pragma unroll",
        "    for (int nt = 0; nt < kNT; ++nt) {",
        "      #pragma unroll",
        f"      for (int j = 0; j < 4; ++j) {{ hold({sums}[0][nt][j]);"
        + (" acc[0][nt][j] += sacc[0][nt][j];" if slice_acc else "") + " }",
        "    }",
        "    #pragma unroll",
        "    for (int ks = 0; ks < kBK / 8; ++ks)   // the products read ah / al until the wait: only now replaced",
        "      #pragma unroll",
        "      for (int i = 0; i < 4; ++i) { hold_u(ah[ks][i]); hold_u(al[ks][i]); ah[ks][i] = nh[ks][i]; al[ks][i] = nl[ks][i]; }",
        "    __syncthreads();                 // slice kt + 1's split is visible, every A read of its slot done",
        "  }",
    ]
