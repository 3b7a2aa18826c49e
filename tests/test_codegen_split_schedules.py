"""Reductions that spread one row or one column over several blocks (codegen/rowkernel.py, issue #14):

  split_column  column tiles too few to fill the SMs: kSplit blocks per tile fold interleaved shares
                of the reduced length, the tile's last block combines the per-column states in split
                order (codegen/last_block.py);
  cluster       rows too long for one block's registers, or fewer rows than SMs: a thread-block
                cluster of up to 8 CTAs per row, each round's state exchanged through distributed
                shared memory in rank order, the row read once. Below two rows per SM the default is
                now the split row (codegen/rowsplit.py, tests/test_codegen_split_rows.py) and the
                cluster its tuning alternative (`split` = 1), which these tests ask for. Rows of
                scalar loads of one input that fill the SMs stream instead (a block of 1024 threads,
                8 loads in flight), the cluster their tuning alternative.

On the CPU: which shapes take them, NVRTC sm_90 builds with no spills (tuning variants too), the
launch parameters (grid, cluster dims, workspace) and the fixed combine order in the source, and
`optimize` on the activation-statistics and log-mel blocks at full size. On the GPU (`-m gpu`): each
schedule against torch at atol = rtol = 1e-4 over 5 draws (-inf and large values for softmax, ragged
sizes), and two runs give the same bits.
"""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.codegen.row_tuning import DEFAULTS as ROW_DEFAULTS
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import kl_terms, row_stats

ROOT = Path(__file__).resolve().parent.parent
T = 2.0


def stats(shape, dim=0):
    """mean, max and min over dim 0 (a calibration observer's column statistics)."""
    return row_stats(shape, dim)


def column_sum(shape, dim=0):
    """One sum over a non-last dim: a single-reduction region (a split column)."""
    p = Program("column_sum")
    x = p.add_input("x", shape)
    n = p.add_node("sum", [x.id], {"dim": [dim]})
    p.mark_output(n.outputs[0])
    return p, [n.id]


def row_op(op, shape):
    """softmax / log_softmax / layer_norm over the last dim, after a / T prologue."""
    p = Program(op)
    x = p.add_input("x", shape)
    d = p.add_node("div_scalar", [x.id], {"value": T})
    attrs = {"normalized_shape": [shape[-1]]} if op == "layer_norm" else {"dim": -1}
    n = p.add_node(op, [d.outputs[0]], attrs)
    p.mark_output(n.outputs[0])
    return p, [d.id, n.id]




def peak_floor(shape):
    """Whisper's log-mel floor: a per-sample max over (mels, frames) broadcast back, then (x + 4) / 4."""
    p = Program("peak_floor")
    x = p.add_input("x", shape)
    m = p.add_node("amax", [x.id], {"dim": [1, 2], "keepdim": True})
    s = p.add_node("sub_scalar", [m.outputs[0]], {"value": 8.0})
    y = p.add_node("maximum", [x.id, s.outputs[0]])
    p.mark_output(y.outputs[0])
    return p, [m.id, s.id, y.id]


# (case, builder, shape, (split, columns per thread) or cluster size)
SPLIT_COLUMNS = [("stats_llama7b", stats, (4096, 4096), (33, 4)),   # the activation_stats block: float4
                 ("stats_ragged", stats, (1001, 4099), (9, 1)),     # columns not a multiple of 4
                 ("stats_3d", lambda s: stats(s, 1), (3, 4000, 130), (63, 1)),  # outer > 1, a partial tile
                 ("sum_llama7b", column_sum, (4096, 4096), (33, 4))]
CLUSTER_ROWS = [("log_softmax_50256", lambda s: row_op("log_softmax", s), (1024, 50256), 4),
                ("softmax_few_rows", lambda s: row_op("softmax", s), (64, 128256), 8),
                ("layer_norm_few_rows", lambda s: row_op("layer_norm", s), (64, 20000), 4),
                ("kl_terms_30522", kl_terms, (2048, 30522), 4),    # kl_div_distill's two rows
                ("log_mel_peak", peak_floor, (64, 80, 3000), 8)]   # log_mel_normalize's per-clip max


def _kernel(builder, shape, **params):
    p, ids = builder(shape)
    return p, generate_kernel(p, ids, name="k", params=params or None)


@pytest.mark.parametrize("case,builder,shape,split", SPLIT_COLUMNS, ids=[c[0] for c in SPLIT_COLUMNS])
def test_columns_too_few_to_fill_the_sms_split_with_a_workspace_per_column(case, builder, shape, split):
    p, ks = _kernel(builder, shape)
    (split, vecx), (outer, cols, inner) = split, ((1, *shape) if len(shape) == 2 else shape)
    tiles = outer * math.ceil(inner / (32 * vecx))
    assert ks.params["schedule"] == "split_column" and ks.params["split"] == split, ks.params
    assert ks.params["vecx"] == vecx and ("float4" in ks.source) == (vecx == 4)
    assert ks.align == (16 if vecx == 4 else 4)      # the launcher copies an input it cannot read 16 B at a time
    assert ks.grid == (tiles * split, 1, 1) and ks.block == (32, 8, 1)
    fields = 1 if case.startswith("sum") else 3    # mean's sum, max, min: one float each
    assert ks.workspace == [("float32", tiles * 32 * vecx * split * fields), ("int32", tiles)]
    assert ks.source.count("float* __restrict__ workspace, unsigned int* __restrict__ counters") == 1
    # deterministic: per-column states combined by the last block in a fixed order (each thread row
    # its splits y, y + kTileY, ..., then the rows in order), no float atomics
    assert re.search(r"for \(int k = threadIdx.y; k < kSplit; k \+= kTileY\) \{.*\n.*workspace \+ .*k\) \*", ks.source)
    assert re.findall(r"atomicAdd\(([^,]+),", ks.source) == ["&counters[tile_id]"]
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.spill_loads == 0 and c.stack_bytes == 0, c.summary()
    assert "warning" not in c.log, c.log


@pytest.mark.parametrize("case,builder,shape,cluster", CLUSTER_ROWS, ids=[c[0] for c in CLUSTER_ROWS])
def test_long_or_few_rows_take_a_cluster(case, builder, shape, cluster):
    p, ks = _kernel(builder, shape, split=1)     # few rows: without the split row
    rows = math.prod(shape[:-1]) if builder is not peak_floor else shape[0]
    assert ks.params["schedule"] == "cluster" and ks.params["cluster"] == cluster, ks.params
    if rows < ROW_DEFAULTS["sm_count"]:     # one wave of rows: each is read once, into registers
        assert ks.params["cached"], "a cluster row is read once, into registers"
    else:               # rows that fill the SMs: CTAs of 256 threads, several per SM
        assert ks.block == (256, 1, 1)
    assert ks.grid == (rows * cluster, 1, 1) and ks.workspace == []
    assert f"constexpr int kCluster = {cluster};" in ks.source
    assert "__launch_bounds__(kBlock" in ks.source and "__cluster_dims__(kCluster, 1, 1)" in ks.source
    # every CTA combines the cluster's states in rank order, then waits before leaving
    rounds = ks.params["rounds"]
    assert ks.source.count("for (int rank = 1; rank < kCluster; ++rank)") == rounds
    assert ks.source.count("__cluster_barrier_wait();") == rounds + 1
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.spill_loads == 0 and c.stack_bytes == 0, c.summary()
    assert "warning" not in c.log, c.log


@pytest.mark.parametrize("builder,shape,schedule", [
    (lambda s: stats(s, 1), (64, 4096, 4096), "column"),    # 8192 column tiles already fill the SMs
    (lambda s: row_op("softmax", s), (6, 4096), "block"),   # 96 KB in all: the launch dominates
    (stats, (500, 300), "column"),                          # 600 KB: no split either
    (lambda s: row_op("softmax", s), (8192, 4096), "block"),  # many rows that one block holds
    (lambda s: row_op("softmax", s), (8, 1 << 19), "split_row"),  # rows longer than 8 CTAs hold, few
    (lambda s: column_sum(s, 1), (64, 1 << 17), "split_row"),   # few long rows reduced away
], ids=["many_tiles", "tiny", "tiny_columns", "many_rows", "too_long", "row_split"])
def test_shapes_that_keep_their_schedule(builder, shape, schedule):
    _, ks = _kernel(builder, shape)
    assert ks.params["schedule"] == schedule, ks.params


def test_rows_of_scalar_loads_that_fill_the_sms_stream_with_eight_loads_in_flight():
    """GPT-2's log_softmax over 1024 rows of 50257 (no multiple of 4: scalar loads) streams each row
    through one block of 1024 threads, 8 loads in flight each (H100: 0.209 ms against the 4-CTA
    cluster's 0.256); the cluster stays the tuner's alternative, the planner costs two reads, and a
    float4 row of the same size (CLUSTER_ROWS) keeps its cluster."""
    from agent_core.analysis.gpu import GPUProfile
    from agent_core.planner import schedule_for
    from agent_core.planner.geometry import Geometry
    p, ids = row_op("log_softmax", (1024, 50257))
    ks = generate_kernel(p, ids, name="k")
    assert ks.params["schedule"] == "stream" and ks.params["threads_per_row"] == 1024
    assert ks.params["unroll"] == 8 and ks.params["vector_width"] == 1 and ks.params["row_reads"] == 2
    space = tune_space(ks)
    assert {"cluster": 4, "sm_count": 132} in space and {"unroll": 4, "sm_count": 132} in space, space
    assert generate_kernel(p, ids, name="k", params={"cluster": 4}).params["schedule"] == "cluster"
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0
    red = Geometry("reduction", (1024,), full=(1024, 50257), rows=1024, row_len=50257, out_full=True)
    assert schedule_for(red, 1, GPUProfile()) == ("two-pass", 0)


def test_softmax_over_dim0_is_not_split():
    """A column softmax needs every column's statistics before it writes: no split (one round only)."""
    p = Program("colsm")
    x = p.add_input("x", (4096, 4096))
    n = p.add_node("softmax", [x.id], {"dim": 0})
    p.mark_output(n.outputs[0])
    ks = generate_kernel(p, [n.id], name="colsm")
    assert ks.params["schedule"] == "column"


@pytest.mark.parametrize("case,builder,shape,n", [SPLIT_COLUMNS[0], CLUSTER_ROWS[0], CLUSTER_ROWS[3]],
                         ids=["split_column", "cluster", "cluster_two_inputs"])
def test_every_tuning_variant_generates_and_builds_without_spills(case, builder, shape, n):
    p, ids = builder(shape)
    ks = generate_kernel(p, ids, name="k")
    variants = tune_space(ks)
    key, n = ("split", n[0]) if ks.params["schedule"] == "split_column" else ("cluster", n)
    # twice / half the blocks or CTAs where they still fit, and the undivided schedule itself
    # (column tiles add their own heights and loads in flight: codegen/column_tile.py)
    assert {v[key] for v in variants if key in v} >= {1, n // 2}, variants
    seen = {ks.params["schedule"]}
    for params in variants:
        v = generate_kernel(p, ids, name="k", params=params)
        seen.add(v.params["schedule"])
        c = compile_kernel(v, arch="sm_90")
        assert c.spill_stores == 0 and c.stack_bytes == 0, (params, c.summary())
    assert len(seen) == 2, seen      # the split / cluster, and the schedule without it


def test_the_planner_costs_a_cluster_row_as_one_read():
    from agent_core.analysis.gpu import GPUProfile
    from agent_core.planner import schedule_for
    from agent_core.planner.geometry import Geometry
    gpu = GPUProfile()
    held = Geometry("reduction", (2048,), full=(2048, 30522), rows=2048, row_len=30522, out_full=True)
    assert schedule_for(held, 2, gpu) == ("cluster-per-row", 16)   # 4 CTAs: 8 floats of each input
    too_long = Geometry("reduction", (512,), full=(512, 1 << 19), rows=512, row_len=1 << 19, out_full=True)
    assert schedule_for(too_long, 1, gpu)[0] == "two-pass"
    few = Geometry("reduction", (8,), full=(8, 1 << 19), rows=8, row_len=1 << 19, out_full=True)
    assert schedule_for(few, 1, gpu) == ("split-row", 32)    # codegen/rowsplit.py: 128 chunks held, read once
    longer = Geometry("reduction", (8,), full=(8, 1 << 21), rows=8, row_len=1 << 21, out_full=True)
    assert schedule_for(longer, 1, gpu) == ("split-row", 0)  # 256 chunks would not all run at once: per phase


def _optimize(block: str, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STITCHCUDA_BLOCKS_SMALL"}
    out = tmp_path / block
    res = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize",
                          str(ROOT / "benchmarks" / "blocks" / f"{block}.py"), "-o", str(out)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    codegen = [e for e in events if e["event"] == "codegen"]
    compiled = [e for e in events if e["event"] == "compile"]
    assert len(codegen) == 1 and all(c["spill_stores"] == 0 for c in compiled), (codegen, compiled)
    return codegen[0], (out / "kernels"), res.stdout


def test_activation_stats_block_at_full_size_splits_its_columns(tmp_path):
    """mean, max, min over 4096 tokens of 4096 channels: one block per 32 channels left the H200's
    SMs latency-bound; tiles of 128 channels (a float4 per thread) each split over 33 blocks."""
    cg, kernels, stdout = _optimize("activation_stats_observer_llama7b", tmp_path)
    assert cg["params"]["schedule"] == "split_column" and cg["params"]["vecx"] == 4
    assert cg["params"]["grid"] == 32 * cg["params"]["split"] and cg["params"]["grid"] >= 4 * 132
    source = "\n".join(f.read_text() for f in kernels.glob("*.cu"))
    assert "last = atomicAdd(&counters[tile_id], 1u) == kSplit - 1;" in source
    assert "tuning variant(s) compiled" in stdout


def test_log_mel_block_at_full_size_spreads_each_clip_over_the_gpu(tmp_path):
    """64 clips of 80 x 3000: one block per clip used 64 of 132 SMs; a cluster of 8 CTAs per clip
    (one read, 512 CTAs) measured 31% of the floor on the H200. Now each clip is 30 chunks of 8000
    held in registers: 1920 blocks each fold their chunk's max, wait for the clip's, and write their
    chunk from the registers (codegen/rowsplit.py)."""
    cg, kernels, _ = _optimize("log_mel_normalize_whisper", tmp_path)
    assert cg["params"]["schedule"] == "split_row" and cg["params"]["split"] == 30 and cg["params"]["cached"]
    assert cg["params"]["grid"] == 64 * 30 and cg["params"]["phases"] == 1
    source = "\n".join(f.read_text() for f in kernels.glob("*.cu"))
    assert "task_s = atomicAdd(&counters[0], 1u);" in source and "__cluster_dims__" not in source


def test_export_finds_a_cluster_kernels_signature(tmp_path):
    from agent_core.export.host import _SIGNATURE
    _, ks = _kernel(CLUSTER_ROWS[1][1], CLUSTER_ROWS[1][2], split=1)
    m = _SIGNATURE.search(ks.source)
    assert m and m.group(1) == ks.name and m.group(2).count("__restrict__") == 2


# ---- on the GPU ----

def _draws(p, ks, seed, hostile):
    g = torch.Generator().manual_seed(seed)
    ins = {}
    for v in ks.inputs:
        shape = p.values[v].shape
        x = torch.randn(shape, generator=g) * 4.0
        if p.values[v].name == "x" and p.name == "peak_floor":
            x = x.exp()
        if hostile:   # masked positions (-inf, a whole row of them too) and large logits
            flat = x.view(-1, shape[-1])
            flat[:, ::7] = -math.inf
            flat[1] = -math.inf
            flat[2, ::3] = 3e4
        ins[v] = x
    return ins


def _check_on_gpu(builder, shape, hostile=False, seeds=(0, 1, 2, 3, 4), **params):
    from agent_core.reference import run_reference
    from agent_core.runtime.launch import load_kernel
    p, ids = builder(shape)
    ks = generate_kernel(p, ids, name="k", params=params or None)
    k = load_kernel(ks, p)
    for seed in seeds:
        ins = _draws(p, ks, seed, hostile)
        want = run_reference(p, {p.values[v].name: t for v, t in ins.items()}, device="cpu", keep=True)
        dev = [ins[v].cuda() for v in ks.inputs]
        got = k(dev)
        again = k(dev)    # the workspace counters were reset by the last block: a replay is exact
        for v, a, b in zip(ks.outputs, got, again):
            torch.testing.assert_close(a.cpu(), want[v], atol=1e-4, rtol=1e-4, equal_nan=True,
                                       msg=lambda m: f"{p.values[v].name} (seed {seed}, {ks.schedule}): {m}")
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), \
                f"{p.values[v].name}: two runs differ ({ks.schedule})"
    return ks


@pytest.mark.parametrize("case,builder,shape,split", SPLIT_COLUMNS, ids=[c[0] for c in SPLIT_COLUMNS])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_split_columns_match_torch_and_repeat_exactly(case, builder, shape, split):
    ks = _check_on_gpu(builder, shape)
    assert ks.params["schedule"] == "split_column"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("split", [2, 7, 64])
def test_gpu_split_column_counts_and_ragged_columns(split):
    """A split the rule would not pick, columns not a multiple of 4 or of the tile."""
    _check_on_gpu(stats, (333, 1027), split=split)


@pytest.mark.parametrize("case,builder,shape,cluster", CLUSTER_ROWS, ids=[c[0] for c in CLUSTER_ROWS])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cluster_rows_match_torch_and_repeat_exactly(case, builder, shape, cluster):
    ks = _check_on_gpu(builder, shape, split=1)
    assert ks.params["schedule"] == "cluster"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op,shape", [("softmax", (64, 128256)), ("log_softmax", (1024, 50257)),
                                      ("softmax", (100, 30001))])
def test_gpu_cluster_softmax_with_inf_and_large_values(op, shape):
    _check_on_gpu(lambda s: row_op(op, s), shape, hostile=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cluster", [2, 3, 8])
def test_gpu_cluster_sizes_and_ragged_rows(cluster):
    """Cluster sizes the rule would not pick (3: not a power of two), rows not a multiple of 4."""
    _check_on_gpu(kl_terms, (37, 40003), cluster=cluster)
