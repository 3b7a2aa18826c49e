"""The tile GEMM's warp-specialised TMA loop for sm_90 (codegen/gemm_tma.py) on the CPU: it compiles
through NVRTC for sm_90a without warnings or spills at both tile widths, names the tensor maps the
runtime encodes (A's rows, B's rows) and launches 512 threads; row reductions and normalising ops after
the epilogue combine through the consumers' named barrier (its producers have left), then across the CTAs
of a row tile as a thread-block cluster or through the workspace; GEMMs it does not take are refused with
the reason, and a matrix a TMA copy cannot read is refused before the driver is asked. On the GPU:
tests/gpu/test_gemm_tma_gpu.py."""
from __future__ import annotations

import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.gemm_mma import FORM
from agent_core.compiler import compile_kernel
from tests.test_gemm_epilogue import program
from tests.test_gemm_norm import program as norm_program
from tests.test_gemm_row_reduction import program as rows_program

TILES = {"form": FORM, "mma": "tma", "block_m": 128, "warps_m": 8, "warps_n": 1, "block_k": 32, "split_k": 1}


@pytest.mark.parametrize("shape,bn,stages,sums", [((300, 260, 64), 128, 4, 2), ((1000, 520, 1000), 64, 6, 1)])
def test_compiles_for_sm90a_without_warnings_or_spills_and_names_its_tensor_maps(shape, bn, stages, sums):
    """One warp copies (TMA), the other producers split B's rows, the consumers read A's fragments into
    registers (wgmma's register-A form) and sum `sums` slices on the tensor cores before adding in fp32:
    no spill and no wgmma serialised by ptxas (its C7512 note) at either tile width."""
    M, N, K = shape
    p = program(M, N, K)
    ks = generate_kernel(p, list(p.nodes), name="gemm_tma",
                         params={**TILES, "block_n": bn, "stages": stages, "sum_slices": sums})
    assert ks.block == (512, 1, 1) and ks.align == 16
    assert "cp.async.bulk.tensor.2d" in ks.source and f"wgmma.mma_async.sync.aligned.m64n{bn}k8" in ks.source
    assert "{%" + str(bn // 2) + ", %" in ks.source          # A from registers
    assert f"constexpr int kSums = {sums};" in ks.source and "__grid_constant__ TmaMap map_a" in ks.source
    a, b = ks.tensor_maps
    assert (ks.inputs[a["input"]], a["rows"], a["cols"], a["box_rows"]) == (p.inputs[0], M, K, 128)
    assert (b["rows"], b["cols"], b["row_stride"], b["box_rows"], b["box_cols"]) == (N, K, K, bn, 32)
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln.lower() or "serializ" in ln.lower()] == []


@pytest.mark.parametrize("N,reds,tiles,cluster", [(100, ["sum", "max"], 1, False), (1000, ["logsumexp"], 8, True),
                                                  (1100, ["logsumexp"], 9, False)],
                         ids=["whole-rows", "rows-shared-by-a-cluster-of-8", "rows-shared-by-9-through-the-workspace"])
def test_row_reductions_after_it_combine_through_the_consumers_barrier(N, reds, tiles, cluster):
    """Up to 8 CTAs sharing a row tile are one thread-block cluster (their states read from each other's
    shared memory, no workspace); more publish them to the workspace for the row tile's last CTA."""
    p = rows_program(300, N, 64, reds)
    ks = generate_kernel(p, list(p.nodes), name="gemm_tma_rows", params={**TILES, "block_n": 128, "stages": 3})
    assert ks.grid[0] == tiles and "rows reduced in the kernel" in ks.schedule
    assert 'bar.sync 1, %0;" :: "n"(kBlock)' in ks.source and "cta_sync();" in ks.source
    assert "__syncthreads" not in ks.source.split("if (threadIdx.x < kProducers)")[1]
    assert ("__cluster_dims__(kNTiles, 1, 1)" in ks.source) == cluster == ("thread-block cluster" in ks.schedule)
    assert bool(ks.workspace) == (tiles > 1 and not cluster)
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln.lower()] == []


@pytest.mark.parametrize("norm", ["layer_norm", "softmax"])
@pytest.mark.parametrize("N,bn,cluster", [(512, 128, True), (1000, 64, False)],
                         ids=["cluster-of-4", "16-ctas-through-the-workspace"])
def test_a_normalising_op_after_it_compiles_with_the_rows_shared(norm, N, bn, cluster):
    """A cluster's CTAs each normalise their own accumulators once they hold the rows' combined states;
    past 8 CTAs the rows' inputs go through the workspace and the row tile's last CTA normalises them."""
    p = norm_program(394, N, 2048, norm)
    ks = generate_kernel(p, list(p.nodes), name="gemm_tma_norm", params={**TILES, "block_n": bn, "stages": 3})
    assert ks.grid[:2] == (-(-N // bn), 4)
    assert ("__cluster_map_shared_rank(tile_st, t)" in ks.source) == cluster
    assert ("__ldcg(workspace + kPreAt + i)" in ks.source) == (not cluster) == bool(ks.workspace)
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln.lower()] == []


@pytest.mark.parametrize("case,why", [("gated", "gated unit"), ("matmul", "B is not a k-contiguous"),
                                      ("odd-k", "16-byte"), ("portable", "CPU emulation"),
                                      ("four-slice-sums", "slices per tensor-core sum")])
def test_gemms_it_does_not_take_are_refused_with_the_reason(case, why):
    params = {**TILES, "block_n": 128, "stages": 3}
    if case == "gated":
        from tests.test_gemm_gated import gated
        p = gated(300, 128, 64)
    elif case == "matmul":
        p = program(300, 260, 64, op="matmul")
    elif case == "odd-k":
        p = program(300, 260, 37)
    elif case == "four-slice-sums":     # too few registers: ptxas would serialise the products
        p, params = program(300, 260, 64), {**params, "sum_slices": 4}
    else:
        p, params = program(300, 260, 64), {**params, "portable": True}
    with pytest.raises(CodegenError, match=why):
        generate_kernel(p, list(p.nodes), name="gemm_tma_no", params=params)


def test_a_matrix_a_tma_copy_cannot_read_is_refused_before_the_driver_is_asked():
    from agent_core.runtime.tensor_map import TensorMapError, encode
    m = {"rows": 300, "cols": 37, "row_stride": 37, "box_rows": 128, "box_cols": 32}
    with pytest.raises(TensorMapError, match="16-byte"):
        encode(0x10000, m)          # rows 148 bytes apart
    with pytest.raises(TensorMapError, match="16-byte aligned"):
        encode(0x10004, {**m, "cols": 64, "row_stride": 64})


def test_the_tuner_tries_its_tiles_on_sm90_where_the_gemm_takes_them():
    """Its tiles are the region's alternatives: tried on sm_90 (first among the other forms of a library
    call + epilogue region, after the tile GEMM's default), never on another GPU or for a GEMM it refuses."""
    from agent_core.agent.tune import tune_space
    p = program(300, 260, 64)
    tile = generate_kernel(p, list(p.nodes), name="g", params={"form": FORM})       # the mma.sync tile GEMM
    assert [v["block_n"] for v in tune_space(tile, arch="sm_90") if v.get("mma") == "tma"] == [128, 64]
    assert not any(v.get("mma") == "tma" for v in tune_space(tile, arch="sm_80"))
    library = generate_kernel(p, list(p.nodes), name="lib")                          # cuBLAS + epilogue kernel
    assert library.library_nodes and [v.get("mma") for v in tune_space(library, arch="sm_90")][1:3] == ["tma", "tma"]
    q = program(300, 260, 64, op="matmul")                                            # B [K, N]
    assert not any(v.get("mma") == "tma" for v in tune_space(generate_kernel(q, list(q.nodes), name="q",
                                                                             params={"form": FORM}), arch="sm_90"))


def test_a_driver_without_tensor_maps_is_a_clear_error(monkeypatch):
    import ctypes

    from agent_core.runtime import tensor_map

    class OldDriver:      # a libcuda from before CUDA 12: no cuTensorMapEncodeTiled
        pass
    monkeypatch.setattr(tensor_map, "_encode", None)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: OldDriver())
    tensor_map._encoded.cache_clear()
    with pytest.raises(tensor_map.TensorMapError, match="no cuTensorMapEncodeTiled"):
        tensor_map.encode(0x10000, {"rows": 300, "cols": 64, "row_stride": 64, "box_rows": 128, "box_cols": 32})


def test_each_address_and_shape_is_encoded_once(monkeypatch):
    """The program runtime launches on the same buffers again and again: the driver is asked once."""
    from agent_core.runtime import tensor_map
    calls = []
    monkeypatch.setattr(tensor_map, "_encode", lambda *args: calls.append(args) or 0)
    tensor_map._encoded.cache_clear()
    m = {"rows": 300, "cols": 64, "row_stride": 64, "box_rows": 128, "box_cols": 32}
    first = tensor_map.encode(0x20000, m)
    assert tensor_map.encode(0x20000, m) is first and len(calls) == 1
    tensor_map.encode(0x30000, m)
    assert len(calls) == 2
    tensor_map._encoded.cache_clear()


def test_few_tiles_and_a_long_k_cut_k_into_parts_that_add_up_as_one_cluster():
    """The tuner's TMA tiles for 6 output tiles of K = 8192 split K into at most 8 parts (as the mma.sync
    loop's do); the parts of a tile are one thread-block cluster that adds up the sums on chip, each part
    finishing its share of the tile: no workspace, and the kernel compiles clean."""
    from agent_core.codegen.gemm_mma import gemm_spec, tma_alternatives
    from agent_core.codegen.region_io import region_io
    p = program(257, 130, 8192)
    alts = tma_alternatives(gemm_spec(p, region_io(p, list(p.nodes))))
    assert [(a["block_n"], a["split_k"]) for a in alts] == [(128, 8), (64, 8), (128, 1), (64, 1)]   # and K whole
    ks = generate_kernel(p, list(p.nodes), name="gemm_tma_split", params=alts[0])
    assert ks.grid == (2, 3, 8) and ks.workspace == [] and "__cluster_dims__(1, 1, 8)" in ks.source
    assert "K cut into 8 parts, one cluster" in ks.schedule
    consumers = ks.source.split('setmaxnreg.inc')[1]
    assert "__cluster_map_shared_rank(part_sums, q)" in consumers and "__syncthreads" not in consumers
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln.lower()] == []


def test_with_a_layer_norm_after_it_the_parts_take_turns_and_the_last_ones_share_the_rows_as_a_cluster():
    """ViT's MLP out (394 x 2048 -> 512) + residual + LayerNorm: 16 or 32 tiles leave most SMs idle, so
    the tuner's TMA tiles cut K too; each tile needs its whole sum for the rows' statistics, so the parts
    take turns through the workspace (on the consumers' barrier) and the last parts, one cluster per
    row tile, combine the rows. Past 8 CTAs a row, through the workspace, K stays whole."""
    from agent_core.codegen.gemm_mma import gemm_spec, tma_alternatives
    from agent_core.codegen.region_io import region_io
    p = norm_program(394, 512, 2048, "layer_norm", after=False)
    alts = tma_alternatives(gemm_spec(p, region_io(p, list(p.nodes))))
    assert [(a["block_n"], a["split_k"]) for a in alts] == [(128, 8), (64, 4), (128, 1), (64, 1)]
    ks = generate_kernel(p, list(p.nodes), name="gemm_tma_ln_split", params=alts[1])
    assert ks.grid == (8, 4, 4) and "__cluster_dims__(kNTiles, 1, 1)" in ks.source
    assert [dt for dt, _ in ks.workspace] == ["float32", "int32"]       # the parts' running sum and turns
    consumers = ks.source.split('setmaxnreg.inc')[1]
    assert "split K: 4 parts of this output tile take turns" in consumers and "__syncthreads" not in consumers
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln.lower()] == []
    wide = norm_program(300, 1000, 4096, "layer_norm", after=False)     # 16 CTAs a row at 128 x 64
    assert [(a["block_n"], a["split_k"]) for a in tma_alternatives(gemm_spec(wide, region_io(wide, list(wide.nodes))))] \
        == [(128, 4), (128, 1), (64, 1)]
