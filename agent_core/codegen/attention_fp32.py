"""The "fp32" form of the fused attention kernel: plain FFMA, exact fp32, no inline PTX (so the CPU
emulator runs it, and it is the fallback where the tensor-core form does not verify).

Per block: kBr query rows of one (batch, head) staged in shared memory once; per key tile of kBc keys,
K and V tiles staged in shared memory, the kBr x kBc logits (one per thread in turn), then one warp per
row for the online softmax (running max m, sum l, the rescale factor of the accumulator), then each
thread's share of the kBr x kEv accumulator updated in registers. One store at the end: acc / l, or 0
for a row whose every key is masked (l == 0), as torch gives.
"""
from __future__ import annotations

import math

from ..ir import Program
from .attention_parts import (base_offsets, build, constants, kernel_source_text, key_tiles, mask_words, notes_for,
                              out_at, parameters, SCORES, score_rule, score_words)
from .cuda import kernel_name
from .kernel import CodegenError
from .region_io import RegionIO

SHARED_LIMIT = 227 * 1024


def render_fp32(program: Program, io: RegionIO, name: str, spec, p: dict):
    br, bc, warps = int(p["block_rows"]), int(p["block_cols"]), int(p["warps"])
    if br < 1 or bc < 1 or warps < 1 or warps > 32:
        raise CodegenError(f"attention fp32: bad tiles {br} x {bc} with {warps} warps")
    block = 32 * warps
    acc_n = math.ceil(br * spec.Ev / block)
    q_s, k_s, v_s, p_s = br * spec.E, bc * (spec.E + 1), bc * spec.Ev, br * (bc + 1)
    shared = 4 * (q_s + k_s + v_s + p_s + 3 * br)
    if shared > SHARED_LIMIT:
        raise CodegenError(f"attention fp32: {shared} bytes of shared memory for tiles {br} x {bc} "
                           f"(at most {SHARED_LIMIT})")
    cparams, names = parameters(program, io)
    q, k, v = spec.q, spec.k, spec.v
    softmax = spec.score == "softmax"
    consts = constants(spec, block, br, bc) + [f"constexpr int kAcc = {acc_n};   // accumulator elements per thread"]
    body = base_offsets(spec, names, br) + [
        "  extern __shared__ float smem[];",
        "  float* Qs = smem;                              // [kBr][kE]",
        f"  float* Ks = Qs + {q_s};                        // [kBc][kE + 1]",
        f"  float* Vs = Ks + {k_s};                        // [kBc][kEv]",
        f"  float* Ps = Vs + {v_s};                        // [kBr][kBc + 1]: logits, then probabilities",
        f"  float* Mrow = Ps + {p_s};  float* Lrow = Mrow + kBr;  float* Arow = Lrow + kBr;",
        "  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
        "  for (int i = tid; i < kBr * kE; i += kBlock) {",
        "    const int r = i / kE, e = i % kE, row = q0 + r;",
        f"    Qs[i] = row < kL ? gq[(long long)row * {q.row_stride} + (long long)e * {q.col_stride}] : 0.0f;",
        "  }",
        "  for (int r = tid; r < kBr; r += kBlock) {",
        f"    Mrow[r] = -INFINITY; Lrow[r] = {'0' if softmax else '1'}.0f; Arow[r] = 1.0f;   // 1: no normalisation",
        "  }",
        "  float acc[kAcc];",
        "  #pragma unroll",
        "  for (int j = 0; j < kAcc; ++j) acc[j] = 0.0f;",
        f"  const int ntiles = {key_tiles(spec)};",
        "  for (int t = 0; t < ntiles; ++t) {",
        "    const int k0 = t * kBc;",
        "    __syncthreads();",
        "    for (int i = tid; i < kBc * kE; i += kBlock) {",
        "      const int c = i / kE, e = i % kE, key = k0 + c;",
        f"      Ks[c * (kE + 1) + e] = key < kS ? gk[(long long)key * {k.row_stride} + (long long)e * {k.col_stride}] : 0.0f;",
        "    }",
        "    for (int i = tid; i < kBc * kEv; i += kBlock) {",
        "      const int c = i / kEv, e = i % kEv, key = k0 + c;",
        f"      Vs[i] = key < kS ? gv[(long long)key * {v.row_stride} + (long long)e * {v.col_stride}] : 0.0f;",
        "    }",
        "    __syncthreads();",
        "    for (int i = tid; i < kBr * kBc; i += kBlock) {",
        "      const int r = i / kBc, c = i % kBc, row = q0 + r, key = k0 + c;",
        "      const float* qr = Qs + r * kE;  const float* kr = Ks + c * (kE + 1);",
        "      float s = 0.0f;",
        "      #pragma unroll 4",
        "      for (int e = 0; e < kE; ++e) s = fmaf(qr[e], kr[e], s);",
        *[f"      {line}" for line in score_rule(spec, "s", "row", "key")],
        "      Ps[r * (kBc + 1) + c] = s;",
        "    }",
        "    __syncthreads();",
        *(_softmax_step() if softmax else _score_step(SCORES[spec.score])),
        "    __syncthreads();",
        "    #pragma unroll",
        "    for (int j = 0; j < kAcc; ++j) {",
        "      const int i = tid + j * kBlock;",
        "      if (i < kBr * kEv) {",
        "        const int r = i / kEv, d = i % kEv;",
        "        const float* pr = Ps + r * (kBc + 1);",
        "        float a = acc[j] * Arow[r];",
        "        #pragma unroll 4",
        "        for (int c = 0; c < kBc; ++c) a = fmaf(pr[c], Vs[c * kEv + d], a);",
        "        acc[j] = a;",
        "      }",
        "    }",
        "  }",
        "  __syncthreads();",
        "  #pragma unroll",
        "  for (int j = 0; j < kAcc; ++j) {",
        "    const int i = tid + j * kBlock;",
        "    if (i < kBr * kEv) {",
        "      const int r = i / kEv, d = i % kEv, row = q0 + r;",
        "      const float l = Lrow[r];",
        f"      if (row < kL) {out_at(spec, 'row', 'd')} = l > 0.0f ? acc[j] / l : 0.0f;",
        "    }",
        "  }",
    ]
    notes = notes_for(spec, br, bc, block, "fp32 (FFMA)")
    src = kernel_source_text(program, io, spec, "Fused attention (FlashAttention-2 schedule), fp32 FFMA form",
                             notes, consts, [], kernel_name(name), cparams, body, block)
    sched = (f"fused attention, fp32 FFMA: {br} query rows x {bc}-key tiles per block of {block} threads, "
             f"{score_words(spec.score)}, {'causal, ' if spec.causal else ''}{mask_words(spec)}")
    return build(program, io, name, spec, src, br=br, block=block, shared=shared, schedule=sched,
                 params={**p, "block": block})


def _softmax_step() -> list[str]:
    """C lines: one warp per row of the tile's logits, the online softmax step (Mrow, Lrow, Arow)."""
    return ["    for (int r = warp; r < kBr; r += kBlock / 32) {   // one warp per row: the online softmax step",
            "      float* pr = Ps + r * (kBc + 1);",
            "      float mx = -INFINITY;",
            "      for (int c = lane; c < kBc; c += 32) mx = fmaxf(mx, pr[c]);",
            "      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));",
            "      const float m_old = Mrow[r], m_new = fmaxf(m_old, mx);",
            "      const float m_use = m_new == -INFINITY ? 0.0f : m_new;   // every key so far masked: p = 0",
            "      float sum = 0.0f;",
            "      for (int c = lane; c < kBc; c += 32) { const float e = expf(pr[c] - m_use); pr[c] = e; sum += e; }",
            "      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);",
            "      __syncwarp();",
            "      if (lane == 0) {",
            "        const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_use);",
            "        Arow[r] = alpha; Lrow[r] = Lrow[r] * alpha + sum; Mrow[r] = m_new;",
            "      }",
            "    }"]


def _score_step(expr: str) -> list[str]:
    """C lines: the tile's logits through an elementwise score (expr of x), in place."""
    return ["    for (int i = tid; i < kBr * kBc; i += kBlock) {",
            "      float* pr = Ps + (i / kBc) * (kBc + 1) + i % kBc;",
            "      const float x = *pr;",
            f"      *pr = {expr};",
            "    }"]
