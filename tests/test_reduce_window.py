"""Reductions a row kernel computes in its prologue (codegen/reduce_window.py): a mean, sum, max or min
whose result another reduction reads as its elements is a lambda looping over each element's window,
so a pooling over tokens and the norm over features after it are one kernel that reads the tokens once.

On the CPU: which reductions are windows (and which are not: per-row values broadcast along longer
rows, a loss's total over its rows), the kernels run by the CPU emulator against torch, an NVRTC sm_90
build, and the planner's choice through the CLI (fused where the window is coalesced and the rows'
elements fill the GPU with threads; not for an image's pooled channels, nor a batch of few elements).
"""
import json
import shutil

import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.codegen.reduce_window import reduced_block, stage_chunk, staged_window, window_reductions
from agent_core.codegen.region_io import region_io
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import emulated

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def pooled_norm(shape, pool="mean", dims=(1,), keepdim=False, norm="layer_norm", mask=False, skip_first=False):
    """pool over `dims` of x [B, T, D] (optionally x * mask[B, T, 1] first, or x[:, 1:]: a ViT's patch
    tokens without its class token), then `norm` over the last dim of the pooled [B, D]: (program,
    region node ids, inputs, the pool's node id)."""
    p = Program("pooled_norm")
    x = p.add_input("x", shape)
    ids, cur = [], x.id

    def node(op, ins, attrs=None):
        n = p.add_node(op, ins, attrs or {})
        ids.append(n.id)
        return n
    inputs = [torch.randn(shape)]
    if skip_first:
        cur = node("slice", [cur], {"dim": 1, "start": 1, "end": None, "step": 1}).outputs[0]
    if mask:
        m = p.add_input("mask", (shape[0], shape[1], 1))
        cur = node("mul", [cur, m.id]).outputs[0]
        inputs.append((torch.rand(shape[0], shape[1], 1) > 0.3).float())
    pooled = node(pool, [cur], {"dim": list(dims), "keepdim": keepdim})
    cur = pooled.outputs[0]
    d = p.values[cur].shape[-1]
    if norm == "layer_norm":
        w, b = p.add_parameter("weight", shape=(d,)), p.add_parameter("bias", shape=(d,))
        cur = node("layer_norm", [cur, w.id, b.id], {"normalized_shape": [d]}).outputs[0]
    elif norm == "l2":            # F.normalize: x / max(||x||, eps)
        n = node("norm", [cur], {"dim": [-1], "keepdim": True, "p": 2.0}).outputs[0]
        n = node("max_scalar", [n], {"value": 1e-12}).outputs[0]
        cur = node("div", [cur, n]).outputs[0]
    else:
        cur = node(norm, [cur], {"dim": -1}).outputs[0]
    p.mark_output(cur)
    return p, ids, inputs, pooled.id


CASES = {
    "token mean, LayerNorm": lambda: pooled_norm((6, 33, 64)),
    "patch tokens' mean (the class token sliced off), LayerNorm": lambda: pooled_norm((3, 17, 64), skip_first=True),
    "masked token sum, L2 normalise": lambda: pooled_norm((5, 40, 48), pool="sum", norm="l2", mask=True),
    "token max, softmax": lambda: pooled_norm((4, 17, 96), pool="max", norm="softmax"),
    "token min, log_softmax, kept dims": lambda: pooled_norm((4, 9, 40), pool="min", keepdim=True, norm="log_softmax"),
    # the window innermost ([B, D, S] pooled over S): staged (the block's windows folded in shared memory)
    "spatial mean, LayerNorm over channels": lambda: pooled_norm((3, 64, 49), dims=(2,)),
    "two spatial dims ([B, C, H, W] -> [B, C])": lambda: pooled_norm_4d(),
    "depth min, softmax over channels (column tiles)": lambda: depth_min_softmax(),
}


@needs_gxx
@pytest.mark.parametrize("case", CASES)
def test_a_reduction_read_as_a_row_is_its_prologue_and_matches_torch(case):
    p, ids, inputs, pool = CASES[case]()
    assert window_reductions(p, region_io(p, ids)) == {pool}
    ks = generate_kernel(p, ids, name="pooled")
    contiguous = reduced_block(p, p.nodes[pool])[2] == 1        # staged through shared memory
    assert ("folded in shared memory (staged)" in ks.source) == contiguous, ks.source
    assert ("each element folds its" in ks.source) != contiguous, ks.source
    assert ks.params["vector_width"] == 1, ks.params       # a warp's neighbouring elements, one at a time
    got, ref = emulated(p, ks, inputs)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()


def pooled_norm_4d():
    """A classifier head's global average pool of [B, C, H, W] then LayerNorm over the C channels."""
    p = Program("head")
    x = p.add_input("features", (2, 32, 7, 7))
    m = p.add_node("mean", [x.id], {"dim": [-2, -1], "keepdim": False})
    w, b = p.add_parameter("weight", shape=(32,)), p.add_parameter("bias", shape=(32,))
    ln = p.add_node("layer_norm", [m.outputs[0], w.id, b.id], {"normalized_shape": [32]})
    p.mark_output(ln.outputs[0])
    return p, [m.id, ln.id], [torch.randn(2, 32, 7, 7)], m.id


def depth_min_softmax(shape=(2, 16, 5, 8, 8)):
    """KernelBench's Conv3d -> min over depth -> softmax over channels: the softmax reduces a middle dim
    (column tiles, a thread per pixel), each element the min over its depth window."""
    p = Program("depth_min")
    x = p.add_input("x", shape)
    m = p.add_node("min", [x.id], {"dim": [2], "keepdim": False})
    s = p.add_node("softmax", [m.outputs[0]], {"dim": 1})
    p.mark_output(s.outputs[0])
    return p, [m.id, s.id], [torch.randn(shape)], m.id


@needs_gxx
def test_a_window_keeps_nan_as_torch_does():
    p, ids, inputs, _ = pooled_norm((3, 8, 32), pool="max", norm="softmax")
    inputs[0][1, 5, 7] = float("nan")
    ks = generate_kernel(p, ids, name="pooled_nan")
    got, ref = emulated(p, ks, inputs)
    assert torch.isnan(got[1]).all() and torch.isnan(ref[1]).all()
    assert torch.allclose(got[0], ref[0], atol=1e-6) and torch.allclose(got[2], ref[2], atol=1e-6)


@needs_gxx
def test_reductions_over_a_dim_of_one_chain_in_one_kernel():
    # KernelBench's 18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp after its sum: max, mean and logsumexp
    # over a dim of size 1, each reading the one before: the first two are windows of one element
    p = Program("ones")
    x = p.add_input("x", (300, 1))
    ids, cur = [], x.id
    for op in ("max", "mean", "logsumexp"):
        n = p.add_node(op, [cur], {"dim": [1], "keepdim": True})
        ids.append(n.id)
        cur = n.outputs[0]
    p.mark_output(cur)
    assert window_reductions(p, region_io(p, ids)) == set(ids[:2])
    ks = generate_kernel(p, ids, name="ones")
    inputs = [torch.randn(300, 1)]
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got, ref, atol=1e-6), (got - ref).abs().max()


def test_per_row_values_and_totals_are_not_windows():
    # a mean subtracted before a variance over the same rows: per-row values broadcast along the row
    p = Program("centred")
    x = p.add_input("x", (8, 64))
    m = p.add_node("mean", [x.id], {"dim": [1], "keepdim": True})
    c = p.add_node("sub", [x.id, m.outputs[0]])
    v = p.add_node("mean", [p.add_node("mul", [c.outputs[0], c.outputs[0]]).outputs[0]], {"dim": [1]})
    p.mark_output(v.outputs[0])
    assert window_reductions(p, region_io(p, list(p.nodes))) == set()
    # a per-row sum then its mean over every row (a loss's total): the row graph folds it row by row
    q = Program("total")
    y = q.add_input("y", (8, 64))
    s = q.add_node("sum", [y.id], {"dim": [1]})
    t = q.add_node("mean", [s.outputs[0]], {"dim": None})
    q.mark_output(t.outputs[0])
    assert window_reductions(q, region_io(q, list(q.nodes))) == set()


def test_the_fused_kernel_compiles_for_sm_90():
    p, ids, _, _ = pooled_norm((256, 128, 384), pool="sum", norm="l2", mask=True)
    ks = generate_kernel(p, ids, name="pooled_l2")
    assert ks.params["schedule"] == "block" and ks.params["threads_per_row"] == 512, ks.params
    ck = compile_kernel(ks)
    assert ck.spill_stores == 0, ck.log


def _plan(path) -> list[str]:
    """`stitchcuda plan --json FILE` at the block's real size, as a shell runs it: the proposed regions'
    reasons."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "STITCHCUDA_BLOCKS_SMALL": "0"}
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", "--json", path], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return [g["reason"] for g in json.loads(r.stdout)["regions"] if g["status"] == "proposed"]


def test_the_planner_fuses_a_vit_heads_token_mean_with_its_layernorm():
    reasons = _plan("benchmarks/blocks/token_mean_fc_norm_vit_b16.py")
    assert len(reasons) == 2, reasons       # the pooled LayerNorm, then the classifier
    fused = reasons[0]
    assert fused.startswith("stitches slice, mean and layer_norm over 256 rows of 768"), fused
    assert "is the mean over its own window of 196, folded as it is read" in fused, fused


def test_the_planner_keeps_them_apart_where_the_window_or_the_threads_are_few():
    # MiniLM's masked sum over tokens then L2 norm: 256 rows of 384 are too few threads for the GPU
    # (planner/fusion.WINDOW_THREADS_PER_SM), so the pooling keeps its own column kernel
    minilm = _plan("benchmarks/blocks/masked_mean_pool_normalize_minilm.py")
    assert len(minilm) == 3 and not any("own window" in r for r in minilm), minilm


def test_the_planner_fuses_a_convnext_heads_pool_with_its_layernorm_staged():
    # the mean over each channel's 7 x 7 pixels: contiguous windows, staged through shared memory
    head = _plan("benchmarks/blocks/pool_layernorm_head_convnext.py")
    assert len(head) == 2, head             # the pooled LayerNorm, then the classifier
    assert head[0].startswith("stitches mean and layer_norm over 256 rows of 768"), head[0]
    assert "the windows are contiguous: each block first reads its rows' windows in coalesced chunks" in head[0], head[0]


@needs_gxx
def test_a_windows_loads_in_flight_are_a_tuning_parameter():
    from agent_core.codegen.kernel import CodegenError
    from agent_core.codegen.row_tuning import tune_variants
    p, ids, inputs, _ = pooled_norm((5, 40, 48), pool="sum", norm="l2", mask=True)
    ks = generate_kernel(p, ids, name="pooled")
    assert ks.params["window_unroll"] == 4 and "#pragma unroll 4\n" in ks.source
    assert {"window_unroll": 8} in [{k: v for k, v in t.items() if k != "sm_count"} for t in tune_variants(ks.params)]
    assert "window_unroll" in tune_variants(ks.params)[0]      # before the trials run out (tune_space's limit)
    wide = generate_kernel(p, ids, name="pooled16", params={"window_unroll": 16})
    assert "#pragma unroll 16\n" in wide.source
    got, ref = emulated(p, wide, inputs)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()
    with pytest.raises(CodegenError, match="window_unroll"):
        generate_kernel(p, ids, name="pooled3", params={"window_unroll": 3})
    # a row kernel with no window has no such parameter, and the tuner offers none
    q = Program("norm")
    x = q.add_input("x", (8, 64))
    n = q.add_node("softmax", [x.id], {"dim": -1})
    q.mark_output(n.outputs[0])
    plain = generate_kernel(q, [n.id], name="plain")
    assert plain.params["window_unroll"] is None
    assert not any("window_unroll" in t for t in tune_variants(plain.params))


@needs_gxx
@pytest.mark.parametrize("shape, kw", [
    ((3, 64, 49), {}),                                        # a block per row, 8 lanes a window
    ((11, 32, 16), {"pool": "sum", "norm": "l2"}),            # warp rows, the last block partial
    ((4, 40, 7), {"pool": "max", "norm": "softmax"}),         # one lane a window
    ((2, 8, 700), {"pool": "min", "norm": "log_softmax"}),    # fewer windows a chunk than lanes
], ids=["mean-block", "sum-warp-rows", "max-one-lane", "min-long-windows"])
def test_contiguous_windows_staged_and_as_loops_match_torch(shape, kw):
    p, ids, inputs, pool = pooled_norm(shape, dims=(2,), **kw)
    assert staged_window(p, region_io(p, ids), p.nodes[pool])
    staged = generate_kernel(p, ids, name="staged")
    loops = generate_kernel(p, ids, name="loops", params={"stage": False})     # the tuner's variant
    assert staged.params["staged_windows"] == 1 and loops.params["staged_windows"] == 0
    assert "window_chunk[t + (t >> 5)]" in staged.source and "each element folds its" in loops.source
    assert staged.shared_bytes > 0 and loops.shared_bytes == 0
    for ks in (staged, loops):
        got, ref = emulated(p, ks, inputs)
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (ks.name, (got - ref).abs().max())


@needs_gxx
def test_a_staged_window_keeps_nan_and_every_chunk():
    # windows of 9 at 64 threads a block: 28 windows a chunk, so a row of 40 spans two chunks
    p, ids, inputs, pool = pooled_norm((5, 40, 9), dims=(2,), pool="max", norm="softmax")
    ks = generate_kernel(p, ids, name="staged_nan", params={"threads_per_row": 64})
    assert stage_chunk(9, 64, 4)[0] < 40
    inputs[0][2, 39, 8] = float("nan")      # the last element of the last window of a row
    got, ref = emulated(p, ks, inputs)
    assert torch.isnan(got[2]).all() and torch.isnan(ref[2]).all()
    keep = [0, 1, 3, 4]
    assert torch.allclose(got[keep], ref[keep], atol=1e-6), (got[keep] - ref[keep]).abs().max()


def test_a_window_read_through_a_permute_is_not_staged():
    # pooled [B, C] transposed before a softmax over B: the block's rows are not its windows
    p = Program("permuted")
    x = p.add_input("x", (6, 32, 49))
    m = p.add_node("mean", [x.id], {"dim": [2], "keepdim": False})
    t = p.add_node("permute", [m.outputs[0]], {"dims": [1, 0]})
    s = p.add_node("softmax", [t.outputs[0]], {"dim": -1})
    p.mark_output(s.outputs[0])
    ids = [m.id, t.id, s.id]
    assert not staged_window(p, region_io(p, ids), p.nodes[m.id])
    if shutil.which("g++"):
        ks = generate_kernel(p, ids, name="permuted")
        got, ref = emulated(p, ks, [torch.randn(6, 32, 49)])
        assert torch.allclose(got, ref, atol=1e-5), (got - ref).abs().max()


@needs_gxx
def test_a_window_too_long_for_a_threads_registers_stays_a_loop():
    # 64 threads a row, windows of 3000: a chunk would be 47 loads a thread (reduce_window.stageable)
    p, ids, inputs, _ = pooled_norm((3, 64, 3000), dims=(2,))
    ks = generate_kernel(p, ids, name="long_windows")
    assert ks.params["staged_windows"] == 0 and "each element folds its 3000 inputs" in ks.source
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (got - ref).abs().max()


def test_a_staged_windows_tuning_variants_come_first_and_each_generates():
    from agent_core.codegen.row_tuning import tune_variants
    p, ids, _, _ = pooled_norm((256, 768, 49), dims=(2,))       # ConvNeXt's head
    ks = generate_kernel(p, ids, name="head")
    assert ks.params["staged_windows"] == 1 and ks.params["threads_per_row"] == 1024
    first = [{k: v for k, v in t.items() if k != "sm_count"} for t in tune_variants(ks.params)[:3]]
    # bench's 3 trials: more loads in flight, twice the blocks an SM, then the per-element loops
    assert first == [{"window_unroll": 8}, {"threads_per_row": 512}, {"stage": False}], first
    for t in tune_variants(ks.params):
        v = generate_kernel(p, ids, name="head_v", params=t)
        assert v.params["staged_windows"] == (0 if t.get("stage") is False else 1), t


@needs_gxx
def test_a_staged_window_reads_through_a_slice_and_pointwise_ops():
    # mean(tanh(x[:, :, 1:]), kept dims) then softmax over the 40 channels: the chunk loads go through the
    # slice's view and evaluate tanh per element; the windows' results are the softmax's rows
    p = Program("sliced")
    x = p.add_input("x", (3, 40, 50))
    s = p.add_node("slice", [x.id], {"dim": 2, "start": 1, "end": None, "step": 1})
    t = p.add_node("tanh", [s.outputs[0]])
    m = p.add_node("mean", [t.outputs[0]], {"dim": [2], "keepdim": True})
    sm = p.add_node("softmax", [m.outputs[0]], {"dim": 1})
    p.mark_output(sm.outputs[0])
    ks = generate_kernel(p, [s.id, t.id, m.id, sm.id], name="sliced")
    assert ks.params["staged_windows"] == 1, ks.params
    got, ref = emulated(p, ks, [torch.randn(3, 40, 50)])
    assert torch.allclose(got, ref, atol=1e-6), (got - ref).abs().max()


def test_the_staged_head_and_its_variants_compile_for_sm_90_without_spills():
    from agent_core.codegen.row_tuning import tune_variants
    p, ids, _, _ = pooled_norm((256, 768, 49), dims=(2,))       # ConvNeXt's head
    ks = generate_kernel(p, ids, name="head")
    for params in [{}, *tune_variants(ks.params)[:3]]:
        v = generate_kernel(p, ids, name="head_v", params=params)
        ck = compile_kernel(v)
        assert ck.spill_stores == 0, (params, ck.log)
