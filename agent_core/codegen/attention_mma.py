"""The "3xtf32" form of the fused attention kernel: m16n8k8 TF32 tensor-core products (mma.sync) for
both Q K^T and P V, each operand split into hi + lo TF32 parts, a_hi b_hi + a_hi b_lo + a_lo b_hi
accumulated in fp32 (runtime/split_tf32.py explains why that is fp32-accurate: only lo * lo, about
2^-22 of a product, is dropped).

Layout: a block of kWarps warps owns kBr = 16 * kWarps query rows, one 16-row slab per warp. Q is
staged in shared memory once; K and V tiles of kBc keys are copied with cp.async into kStages buffers
(double buffering: the next tile's copy runs while this one is computed). Per warp and key tile:
  S (16 x kBc, kBc / 8 accumulator fragments) = Q K^T, scaled and masked in base 2 (exp2);
  online softmax on the fragments: each thread holds two rows (g, g + 8) and reduces its quad by shuffles;
  P goes through a warp-private shared tile, because the m16n8k8 A operand and C accumulator layouts
  differ, and comes back as A fragments; O (16 x kEv) += P V in registers, rescaled by exp2(m_old - m_new).
Each split is three integer/float ops (split_tf32 below); up to head dim 64 (q_regs) each warp's Q
fragments are split once into registers; __launch_bounds__ names the blocks per SM shared memory
allows, so ptxas may use the registers they leave (resident_blocks).
P V of each key tile is summed in a zeroed accumulator and added to the running output by FFMA
(tile_acc): the mma's own accumulation does not round to nearest, and over thousands of keys of
same-signed values (a flat softmax over [0, 1) inputs) the running sum drifted 1.7e-4 from float64
at S = 16384 (2.3e-6 per tile; H200, tools/attention_accuracy_probe.py).
Rows past L read zeros and are not stored; keys past S are -inf; head dims are zero-padded to a
multiple of 8 in shared memory. The running sum l is kept per thread and reduced over the quad once.
"""
from __future__ import annotations

import math

from ..ir import Program
from .attention_parts import (base_offsets, build, constants, kernel_source_text, key_tiles, mask_words, notes_for,
                              out_at, parameters, SCORES, score_rule, score_words)
from .cuda import kernel_name
from .kernel import CodegenError
from .region_io import RegionIO
from .mma_portable import PORTABLE_HELPERS

SHARED_LIMIT = 227 * 1024
SM_SHARED = 228 * 1024      # per SM on sm_80 / sm_90
SM_REGISTERS = 65536
Q_REGS_LIMIT = 64     # Q's hi + lo fragments in registers: 2 x kEp / 2 per thread, 64 at head dim 64
TILE_ACC_LIMIT = 128  # a key tile's own P V accumulator beside the running one (4 x kEvp / 8 each): up to Ev 128
LOG2E = "1.4426950408889634f"

HELPERS = r"""
// hi: x rounded to TF32 (half a TF32 ulp added to the bits; the tensor cores ignore the low 13 bits, as
// ptxas's own cvt.rna lowering assumes), lo: the exact remainder x - hi, read as TF32 the same way.
// Three integer/float ops, no cvt (whose lowering adds an inf test and a select per part).
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  const unsigned h = __float_as_uint(x) + 0x1000u;
  hi = h;
  lo = __float_as_uint(x - __uint_as_float(h & 0xffffe000u));
}
// c += a * b for one m16n8k8 tile, TF32 operands, fp32 accumulators
__device__ __forceinline__ void mma_tf32(float* c, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c += (a_hi + a_lo)(b_hi + b_lo) without the lo * lo term: small terms first
__device__ __forceinline__ void mma_3xtf32(float* c, const unsigned* ah, const unsigned* al,
                                           const unsigned* bh, const unsigned* bl) {
  mma_tf32(c, al, bh);
  mma_tf32(c, ah, bl);
  mma_tf32(c, ah, bh);
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool ok) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool ok) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
"""


def _vector_ok(op, dim: int) -> bool:
    """16-byte copies: the head dim is contiguous, a multiple of 4, and every row starts 16-byte aligned."""
    return op.col_stride in (0, 1) and dim % 4 == 0 and op.offset % 4 == 0 and op.row_stride % 4 == 0 and \
        all(s % 4 == 0 for s in op.batch_strides) and (op.col_stride == 1 or dim == 1)


def _copy_tile(dst: str, src: str, op, rows: int, first: str, limit: str, dim: int, dpad: int, stride: int,
               indent: str) -> list[str]:
    """C lines: cp.async of `rows` rows (first + r, valid below limit) of `dim` columns into dst
    (row stride `stride`, zero-filled up to dpad columns)."""
    if _vector_ok(op, dim):
        per = dpad // 4
        return [f"{indent}for (int i = tid; i < {rows * per}; i += kBlock) {{",
                f"{indent}  const int r = i / {per}, e = (i % {per}) * 4, row = {first} + r;",
                f"{indent}  const bool ok = row < {limit} && e < {dim};",
                f"{indent}  cp_async16({dst} + r * {stride} + e, ok ? {src} + (long long)row * {op.row_stride} + e : {src}, ok);",
                f"{indent}}}"]
    return [f"{indent}for (int i = tid; i < {rows * dpad}; i += kBlock) {{",
            f"{indent}  const int r = i / {dpad}, e = i % {dpad}, row = {first} + r;",
            f"{indent}  const bool ok = row < {limit} && e < {dim};",
            f"{indent}  cp_async4({dst} + r * {stride} + e, ok ? {src} + (long long)row * {op.row_stride} + (long long)e * {op.col_stride} : {src}, ok);",
            f"{indent}}}"]


def shared_bytes(spec, br: int, bc: int, warps: int, stages: int) -> int:
    ep, evp = _pad8(spec.E), _pad8(spec.Ev)
    return 4 * (br * (ep + 4) + stages * bc * (ep + 4) + stages * bc * (evp + 8) + warps * 16 * (bc + 4))


def resident_blocks(shared: int, block: int) -> int:
    """Blocks an SM holds by shared memory (1 KB of it reserved per block), at most as many as leave
    each thread 128 registers: __launch_bounds__ then lets ptxas use every register that many leave
    (without it ptxas stops at 128 and the unrolled loops spill)."""
    return max(1, min(SM_SHARED // (shared + 1024), SM_REGISTERS // (block * 128)))


def _pragma(unroll: int) -> str:
    return "#pragma unroll" if unroll <= 0 else f"#pragma unroll {unroll}"


def _q_fragments() -> list[str]:
    """C lines: this warp's Q A-fragments, split once into hi + lo registers (Q is reused by every key tile)."""
    return ["  unsigned qh[kEp / 8][4], ql[kEp / 8][4];",
            "  cp_async_wait<1>();",
            "  __syncthreads();",
            "  {",
            "    const int wq = (tid >> 5) * 16 + ((tid & 31) >> 2), tq = tid & 3;",
            "    #pragma unroll",
            "    for (int kk = 0; kk < kEp / 8; ++kk) {",
            "      const float* qa = Qs + wq * kQS + kk * 8 + tq;",
            "      split_tf32(qa[0], qh[kk][0], ql[kk][0]); split_tf32(qa[8 * kQS], qh[kk][1], ql[kk][1]);",
            "      split_tf32(qa[4], qh[kk][2], ql[kk][2]); split_tf32(qa[8 * kQS + 4], qh[kk][3], ql[kk][3]);",
            "    }",
            "  }"]


def _product(acc: str, single: bool) -> str:
    """One fragment pair's products: three (split TF32), or a_hi b_hi alone (plain TF32, where the
    program allows it: the lo splits are then unused and the compiler drops them)."""
    return f"mma_tf32({acc}, ah, bh);" if single else f"mma_3xtf32({acc}, ah, al, bh, bl);"


def _scores(q_regs: bool, unroll: int, single: bool = False) -> list[str]:
    """C lines: sacc = Q K^T for this warp's 16 rows and the tile's keys, K split as its fragments load;
    Q's fragments from registers (q_regs, split once) or from shared memory (split per tile)."""
    if q_regs:
        head = ["      #pragma unroll",
                "      for (int kk = 0; kk < kEp / 8; ++kk) {",
                "        const unsigned* ah = qh[kk];",
                "        const unsigned* al = ql[kk];"]
        col = "kk * 8 + t4"
    else:
        head = [f"      {_pragma(unroll)}",
                "      for (int kk = 0; kk < kEp; kk += 8) {",
                "        const float* qa = Qs + (w * 16 + g) * kQS + kk + t4;",
                "        unsigned ah[4], al[4];",
                "        split_tf32(qa[0], ah[0], al[0]); split_tf32(qa[8 * kQS], ah[1], al[1]);",
                "        split_tf32(qa[4], ah[2], al[2]); split_tf32(qa[8 * kQS + 4], ah[3], al[3]);"]
        col = "kk + t4"
    return head + ["        #pragma unroll",
                   "        for (int n = 0; n < kNT; ++n) {",
                   f"          const float* kb = Kt + (n * 8 + g) * kKS + {col};",
                   "          unsigned bh[2], bl[2];",
                   "          split_tf32(kb[0], bh[0], bl[0]); split_tf32(kb[4], bh[1], bl[1]);",
                   f"          {_product('sacc[n]', single)}",
                   "        }",
                   "      }"]


def _pv_head(tile_acc: bool) -> list[str]:
    """C lines before P V: the running output rescaled by alpha in place, or (tile_acc) a zeroed
    accumulator for this key tile's products."""
    if tile_acc:
        return ["      float pacc[kNV][4];",
                "      #pragma unroll",
                "      for (int n = 0; n < kNV; ++n) { pacc[n][0] = pacc[n][1] = pacc[n][2] = pacc[n][3] = 0.0f; }"]
    return ["      #pragma unroll",
            "      for (int n = 0; n < kNV; ++n) {",
            "        oacc[n][0] *= alpha[0]; oacc[n][1] *= alpha[0]; oacc[n][2] *= alpha[1]; oacc[n][3] *= alpha[1];",
            "      }"]


def _pv_tail(tile_acc: bool) -> list[str]:
    """C lines after P V (tile_acc): the tile's products added to the rescaled running output by
    FFMA, rounded to nearest."""
    if not tile_acc:
        return []
    return ["      #pragma unroll",
            "      for (int n = 0; n < kNV; ++n) {",
            "        oacc[n][0] = fmaf(oacc[n][0], alpha[0], pacc[n][0]); oacc[n][1] = fmaf(oacc[n][1], alpha[0], pacc[n][1]);",
            "        oacc[n][2] = fmaf(oacc[n][2], alpha[1], pacc[n][2]); oacc[n][3] = fmaf(oacc[n][3], alpha[1], pacc[n][3]);",
            "      }"]


def _softmax_probabilities() -> list[str]:
    """C lines after the tile's scores: the online softmax step (running max and sum, base 2), the
    probabilities written to this warp's Ps rows."""
    return ["      float alpha[2], m_use[2];",
            "      #pragma unroll",
            "      for (int h = 0; h < 2; ++h) {",
            "        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));",
            "        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));",
            "        const float m_new = fmaxf(m_run[h], mx[h]);",
            "        m_use[h] = m_new == -INFINITY ? 0.0f : m_new;   // every key so far masked: p = 0",
            "        alpha[h] = m_run[h] == -INFINITY ? 0.0f : exp2f(m_run[h] - m_use[h]);",
            "        m_run[h] = m_new;",
            "        l_run[h] *= alpha[h];",
            "      }",
            "      #pragma unroll",
            "      for (int n = 0; n < kNT; ++n) {",
            "        float pv[4];",
            "        #pragma unroll",
            "        for (int j = 0; j < 4; ++j) { pv[j] = exp2f(sacc[n][j] - m_use[j >> 1]); l_run[j >> 1] += pv[j]; }",
            "        *reinterpret_cast<float2*>(Ps + g * kPS + n * 8 + 2 * t4) = make_float2(pv[0], pv[1]);",
            "        *reinterpret_cast<float2*>(Ps + (g + 8) * kPS + n * 8 + 2 * t4) = make_float2(pv[2], pv[3]);",
            "      }"]


def _score_probabilities(expr: str) -> list[str]:
    """C lines after the tile's logits: an elementwise score of each (expr of x), written to this
    warp's Ps rows; nothing to rescale (alpha 1)."""
    return ["      const float alpha[2] = {1.0f, 1.0f};",
            "      #pragma unroll",
            "      for (int n = 0; n < kNT; ++n) {",
            "        float pv[4];",
            "        #pragma unroll",
            f"        for (int j = 0; j < 4; ++j) {{ const float x = sacc[n][j]; pv[j] = {expr}; }}",
            "        *reinterpret_cast<float2*>(Ps + g * kPS + n * 8 + 2 * t4) = make_float2(pv[0], pv[1]);",
            "        *reinterpret_cast<float2*>(Ps + (g + 8) * kPS + n * 8 + 2 * t4) = make_float2(pv[2], pv[3]);",
            "      }"]


def _pad8(d: int) -> int:
    return math.ceil(d / 8) * 8


def render_mma(program: Program, io: RegionIO, name: str, spec, p: dict):
    warps, bc = int(p["warps"]), int(p["block_cols"])
    br = 16 * warps
    if p.get("block_rows") not in (None, br):
        raise CodegenError(f"attention 3xtf32: block_rows must be 16 x warps ({br}), got {p['block_rows']}")
    if bc % 8 or not 8 <= bc <= 128 or not 1 <= warps <= 16:
        raise CodegenError(f"attention 3xtf32: key tile {bc} (a multiple of 8 up to 128) with {warps} warps")
    q_regs = bool(p.get("q_regs"))
    single = bool(p.get("tf32"))      # one TF32 product, where the program allows it
    tile_acc = p.get("tile_acc") is not False
    unroll = int(p.get("unroll") or 0)
    if q_regs and _pad8(spec.E) > Q_REGS_LIMIT:
        raise CodegenError(f"attention 3xtf32: Q in registers takes head dims up to {Q_REGS_LIMIT} (got {spec.E})")
    stages = p.get("stages")
    if stages is None:
        stages = 2 if shared_bytes(spec, br, bc, warps, 2) <= SHARED_LIMIT else 1
    shared = shared_bytes(spec, br, bc, warps, int(stages))
    if shared > SHARED_LIMIT:
        raise CodegenError(f"attention 3xtf32: {shared} bytes of shared memory for {br} x {bc} tiles "
                           f"(at most {SHARED_LIMIT})")
    block = 32 * warps
    if p.get("min_blocks") is None:
        blocks = resident_blocks(shared, block)
        if tile_acc and _pad8(spec.Ev) > 64:   # two accumulators of kEvp / 2 each: ptxas needs up to 255 registers
            blocks = max(1, min(blocks, SM_REGISTERS // (block * 255)))
        p = {**p, "min_blocks": blocks}
    ep, evp = _pad8(spec.E), _pad8(spec.Ev)
    qs, ks, vs, ps = ep + 4, ep + 4, evp + 8, bc + 4
    cparams, names = parameters(program, io)
    consts = constants(spec, block, br, bc) + [
        f"constexpr int kStages = {stages};", f"constexpr int kEp = {ep};   // head dims padded to a multiple of 8",
        f"constexpr int kEvp = {evp};", f"constexpr int kQS = {qs}, kKS = {ks}, kVS = {vs}, kPS = {ps};   // smem row strides",
        "constexpr int kNT = kBc / 8;    // score fragments per warp", "constexpr int kNV = kEvp / 8;   // output fragments per warp"]
    pointwise = spec.score != "softmax"      # an elementwise score: no running max or sum
    rule = score_rule(spec, "s", "row", "key", log2e=not pointwise)
    mma_skip = "      if (k0 > q0 + w * 16 + 15) continue_warp = true;   // causal: every key of the tile after the slab's rows" \
        if spec.causal else None
    body = base_offsets(spec, names, br) + [
        "  extern __shared__ __align__(16) float smem[];",
        "  float* Qs = smem;                                  // [kBr][kQS]",
        "  float* Ks = Qs + kBr * kQS;                        // [kStages][kBc][kKS]",
        "  float* Vs = Ks + kStages * kBc * kKS;              // [kStages][kBc][kVS]",
        "  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;",
        "  float* Ps = Vs + kStages * kBc * kVS + w * 16 * kPS;   // this warp's [16][kPS] probabilities",
        *_copy_tile("Qs", "gq", spec.q, br, "q0", "kL", spec.E, ep, qs, "  "),
        *(["  cp_async_commit();   // Q in a group of its own: split into registers once K/V's first copy is on its way"]
          if q_regs else []),
        f"  const int ntiles = {key_tiles(spec)};",
        "  auto load_kv = [&](int tile, int stage) {",
        "    const int k0 = tile * kBc;",
        *_copy_tile("(Ks + stage * kBc * kKS)", "gk", spec.k, bc, "k0", "kS", spec.E, ep, ks, "    "),
        *_copy_tile("(Vs + stage * kBc * kVS)", "gv", spec.v, bc, "k0", "kS", spec.Ev, evp, vs, "    "),
        "  };",
        "  load_kv(0, 0);",
        "  cp_async_commit();",
        *(_q_fragments() if q_regs else []),
        "  float oacc[kNV][4];",
        "  #pragma unroll",
        "  for (int n = 0; n < kNV; ++n) { oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.0f; }",
        *([] if pointwise else
          ["  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};   // rows g and g + 8 (base 2)"]),
        "  const int row_a = q0 + w * 16 + g, row_b = row_a + 8;",
        "  for (int tile = 0; tile < ntiles; ++tile) {",
        "    const int stage = kStages == 1 ? 0 : (tile & 1);",
        "    if (kStages == 1 && tile > 0) { load_kv(tile, 0); cp_async_commit(); }",
        "    if (kStages > 1 && tile + 1 < ntiles) { load_kv(tile + 1, stage ^ 1); cp_async_commit(); cp_async_wait<1>(); }",
        "    else cp_async_wait<0>();",
        "    __syncthreads();",
        "    const int k0 = tile * kBc;",
        "    bool continue_warp = false;",
        *([mma_skip] if mma_skip else []),
        "    if (!continue_warp) {",
        "      const float* Kt = Ks + stage * kBc * kKS;",
        "      const float* Vt = Vs + stage * kBc * kVS;",
        "      float sacc[kNT][4];",
        "      #pragma unroll",
        "      for (int n = 0; n < kNT; ++n) { sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0.0f; }",
        *_scores(q_regs, unroll, single),
        *([] if pointwise else ["      float mx[2] = {-INFINITY, -INFINITY};"]),
        "      #pragma unroll",
        "      for (int n = 0; n < kNT; ++n) {",
        "        #pragma unroll",
        "        for (int j = 0; j < 4; ++j) {",
        "          const int row = j < 2 ? row_a : row_b, key = k0 + n * 8 + 2 * t4 + (j & 1);",
        "          float s = sacc[n][j];",
        *[f"          {line}" for line in rule],
        "          sacc[n][j] = s;",
        *([] if pointwise else ["          mx[j >> 1] = fmaxf(mx[j >> 1], s);"]),
        "        }",
        "      }",
        *(_score_probabilities(SCORES[spec.score]) if pointwise else _softmax_probabilities()),
        *_pv_head(tile_acc),
        "      __syncwarp();",
        f"      {_pragma(unroll)}",
        "      for (int kk = 0; kk < kBc; kk += 8) {",
        "        const float* pa = Ps + g * kPS + kk + t4;",
        "        unsigned ah[4], al[4];",
        "        split_tf32(pa[0], ah[0], al[0]); split_tf32(pa[8 * kPS], ah[1], al[1]);",
        "        split_tf32(pa[4], ah[2], al[2]); split_tf32(pa[8 * kPS + 4], ah[3], al[3]);",
        "        #pragma unroll",
        "        for (int n = 0; n < kNV; ++n) {",
        "          const float* vb = Vt + (kk + t4) * kVS + n * 8 + g;",
        "          unsigned bh[2], bl[2];",
        "          split_tf32(vb[0], bh[0], bl[0]); split_tf32(vb[4 * kVS], bh[1], bl[1]);",
        f"          {_product(('pacc' if tile_acc else 'oacc') + '[n]', single)}",
        "        }",
        "      }",
        *_pv_tail(tile_acc),
        "      __syncwarp();",
        "    }",
        "    __syncthreads();   // every warp is done with this stage before it is refilled",
        "  }",
        *(["  const float inv_a = 1.0f, inv_b = 1.0f;   // elementwise scores: no normalisation"] if pointwise else [
            "  #pragma unroll",
            "  for (int h = 0; h < 2; ++h) {",
            "    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);",
            "    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);",
            "  }",
            "  const float inv_a = l_run[0] > 0.0f ? 1.0f / l_run[0] : 0.0f;   // a fully masked row: zeros",
            "  const float inv_b = l_run[1] > 0.0f ? 1.0f / l_run[1] : 0.0f;"]),
        "  #pragma unroll",
        "  for (int n = 0; n < kNV; ++n) {",
        "    const int d = n * 8 + 2 * t4;",
        "    if (row_a < kL) {",
        f"      if (d < kEv) {out_at(spec, 'row_a', 'd')} = oacc[n][0] * inv_a;",
        f"      if (d + 1 < kEv) {out_at(spec, 'row_a', 'd + 1')} = oacc[n][1] * inv_a;",
        "    }",
        "    if (row_b < kL) {",
        f"      if (d < kEv) {out_at(spec, 'row_b', 'd')} = oacc[n][2] * inv_b;",
        f"      if (d + 1 < kEv) {out_at(spec, 'row_b', 'd + 1')} = oacc[n][3] * inv_b;",
        "    }",
        "  }",
    ]
    words = "TF32" if single else "3xTF32"
    notes = notes_for(spec, br, bc, block, "TF32 as the program allows (mma.sync m16n8k8, hi parts only; about "
                      "1e-3 relative)" if single else "3xtf32 (mma.sync m16n8k8, hi + lo TF32 parts)") + [
        f"{stages} shared-memory stage(s) of K and V (cp.async), {shared} bytes of shared memory;",
        "P V accumulated per key tile, then added to the running output by FFMA (round to nearest)."
        if tile_acc else "P V accumulated into the running output by the tensor cores."]
    src = kernel_source_text(program, io, spec, f"Fused attention (FlashAttention-2 schedule), {words} tensor-core form",
                             notes, consts, (PORTABLE_HELPERS if p.get("portable") else HELPERS).strip("\n").splitlines(),
                             kernel_name(name), cparams, body, block,
                             min_blocks=p.get("min_blocks"))
    sched = (f"fused attention, {words} mma.sync: {br} query rows ({warps} warps x 16) x {bc}-key tiles, "
             f"{stages}-stage cp.async K/V, {score_words(spec.score)}, "
             f"{'causal, ' if spec.causal else ''}{mask_words(spec)}")
    vec = all(_vector_ok(o, d) for o, d in ((spec.q, spec.E), (spec.k, spec.E), (spec.v, spec.Ev)))
    return build(program, io, name, spec, src, br=br, block=block, shared=shared, schedule=sched,
                 params={**p, "block_rows": br, "stages": stages, "block": block, "tile_acc": tile_acc},
                 align=16 if vec else 4)
