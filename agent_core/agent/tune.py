"""The tuning space of each kernel kind: the launch parameters codegen exposes, as a short list of
alternatives to the default, most promising first. The loop measures each and keeps the fastest that
verifies.
"""
from __future__ import annotations


def tune_space(ks, *, sm_count: int = 132, limit: int = 6, arch: str | None = None) -> list[dict]:
    """Parameter dicts to try besides the default that produced `ks` (a KernelSource): first the
    region's other forms (a library call + epilogue's tile GEMM or direct convolution, agent/gemm_form.py;
    on sm_90 the tile GEMM's TMA tiles among them, gemm_tma.tried_on), then its own. arch: the target's
    sm_XY (default: the GPU's, else sm_90)."""
    from ..compiler import default_arch
    from ..codegen import gemm_tma
    arch = arch or default_arch()
    p = ks.params or {}
    # the TMA loop's tiles (codegen/gemm_tma.py) only where it runs: sm_90, once it is in the tuner
    others = [a for a in ks.alternatives if a.get("mma") != gemm_tma.MMA or gemm_tma.tried_on(arch)]
    out: list[dict] = [{"sm_count": sm_count, **a} for a in others]
    if ks.kind == "row_reduction" and (p.get("guarded") or p.get("guarded_rows")):
        # loads behind a where's condition (rowguard.py) wait for that condition: where little is
        # masked (a cross entropy with no ignored label) the plain loads may be faster
        out.append({"guard_loads": False, "sm_count": sm_count})
    if ks.kind == "gemm":
        from ..codegen.gemm_mma import tune_variants as gemm_variants
        out += gemm_variants(p)       # other tiles
    elif ks.kind == "convolution":
        from ..codegen.conv import tune_variants as conv_variants
        out += conv_variants(p)        # a direct form's channels a thread, blocks
    elif ks.kind == "pointwise":
        for cand in ({"cover": True}, {"unroll": 1}, {"unroll": 2}, {"block": 128}, {"block": 512},
                     {"vector_width": 1}):
            out.append({**cand, "sm_count": sm_count})
    elif ks.kind == "row_reduction" and p.get("schedule") == "split_row":
        from ..codegen.rowsplit import tune_variants as split_row_variants
        out += split_row_variants(p, sm_count=sm_count)      # chunks per row (few long rows)
    elif ks.kind == "row_reduction":
        from ..codegen.row_tuning import tune_variants
        out += tune_variants(p, sm_count=sm_count)
    elif ks.kind == "attention":
        from ..codegen.attention import tune_variants as attention_variants
        out += attention_variants(p)     # the other precision form, key tiles, warps
    elif ks.kind in ("layout", "strided_slice"):
        from ..codegen.layout_graph import tune_variants as gather_variants
        from ..codegen.layout_staged import tune_variants as staged_variants
        from ..codegen.layout_tiled import tune_variants as tile_variants
        # tiles; elements per thread of the staged gather; the plain gather's run packing and blocks
        out += tile_variants(p) + staged_variants(p) + gather_variants(p)
    return out[:limit]
