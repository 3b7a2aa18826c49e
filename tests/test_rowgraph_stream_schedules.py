"""The row graph's schedules where it ran slower than the templates on the H200 (2026-12-05):

- classes on a strided dim (DeepLab's [N, 19, H, W] log_softmax -> nll_loss): one thread per column,
  256 columns per block, nothing combined across thread rows (column tiles of 8 thread rows: 0.12x);
- long rows enough to fill the SMs, read once (a pooled mean of 64k columns, cross entropy over 32k
  classes): one block streaming each row, kUnroll float4 loads in flight, no thread-block cluster
  (0.51x-0.68x); fewer rows than SMs still take a cluster;
- scans longer than a warp's share: 256 threads per row, scan.py's measured choice (1024: 0.59x);
- a total over every row (a loss's sum and count): each block combines its rows' shares before the
  last block combines the blocks' (one share per row made DeepLab's loss 7x slower than class_loss);
- a split column's last block: every thread row folds its share of the splits, then the rows in
  order (one thread per column walking every split alone: a 64 MB column reduction at 341 GB/s).

CPU: generated, compiled with NVRTC for sm_90, and run on the CPU emulator against torch (sm_count=1
stands in for the H200's 132 SMs, so a small tensor has "enough columns").
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_core.codegen.region_io import region_io
from agent_core.codegen.rowkernel import generate_multi_reduction
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import random_inputs, run_reference
from tests.test_codegen_class_loss import log_softmax_nll_program
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


def _emulated(p, ids, params, seed=0):
    ks = generate_multi_reduction(p, region_io(p, ids), "rows", params)
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0
    env = run_reference(p, random_inputs(p, seed=seed), keep=True)      # labels drawn in [0, classes)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v].float(), atol=1e-5, rtol=1e-5, equal_nan=True)
    return ks


def _reduce(shape, op, dim):
    """One op over `dim` of x: softmax and the scans take an int dim, reductions a list."""
    p = Program("rows")
    x = p.add_input("x", shape)
    n = p.add_node(op, [x.id], {"dim": dim} if op in ("softmax", "cumsum") else {"dim": [dim]})
    p.mark_output(n.outputs[0])
    return p, [n.id]


@needs_gxx
@pytest.mark.parametrize("classes,seed", [(7, 0), (19, 0), (19, 1)])
def test_classes_on_a_strided_dim_take_one_thread_per_column(classes, seed):
    p, ids = log_softmax_nll_program((2, classes, 24, 40))
    ks = _emulated(p, ids, {"sm_count": 1}, seed)
    assert ks.params["schedule"] == "column" and ks.params["tile_y"] == 1 and ks.block == (256, 1, 1)
    assert ks.schedule.startswith("one thread per column, 256 columns per block")
    # 7 classes held in registers (two-pass); 19 streamed through the online log-sum-exp, read once
    assert ("row in registers" if classes <= 16 else "the row read 1 times") in ks.schedule
    # the loss's sum and count: one share per block (its 256 pixels combined first), not one per
    # pixel for the last block to read one after another (H100: 7x slower than class_loss so)
    assert ks.workspace[0] == ("float32", ks.grid[0] * 2) and ks.grid[0] < 2 * 24 * 40
    # few columns for the SMs: thread rows share each column, as before
    few = generate_multi_reduction(p, region_io(p, ids), "rows", {"sm_count": 132})
    assert few.params["tile_y"] > 1


@needs_gxx
def test_a_column_written_per_element_keeps_its_thread_rows():
    """A softmax over channels writes every element: its thread rows hold the column in registers
    (one read), where one thread per column would read it twice."""
    p, ids = _reduce((2, 24, 1000), "softmax", 1)
    ks = _emulated(p, ids, {"sm_count": 1})
    assert ks.params["tile_y"] > 1 and ks.params["cached"]


@needs_gxx
def test_many_long_rows_read_once_stream_without_a_cluster():
    # 256 rows of 20000: a row fits no block's registers; with 2 SMs the rows fill the GPU
    p, ids = _reduce((256, 20000), "logsumexp", 1)
    ks = _emulated(p, ids, {"sm_count": 2, "spread_min_bytes": 0})
    assert ks.params["schedule"] == "stream" and ks.params["cluster"] == 1
    assert ks.params["threads_per_row"] == 512     # rows for two blocks per SM: several rows share one
    assert "__cluster_dims__" not in ks.source
    body = ks.source.split("__global__")[1]
    # kUnroll float4 loads issued before the first fold
    assert "constexpr int kUnroll = 4;" in ks.source and "p0 += kUnroll * kStride" in body
    first_fold = body.index("fold_")
    assert body[:first_fold].count("float4") >= 1 and "for (int u = 0; u < kUnroll; ++u)" in body[:first_fold]


def test_few_long_rows_still_spread_over_a_cluster():
    p, ids = _reduce((8, 20000), "logsumexp", 1)
    ks = generate_multi_reduction(p, region_io(p, ids), "rows", {"sm_count": 132, "spread_min_bytes": 0, "split": 1})
    assert ks.params["schedule"] == "cluster" and ks.params["cluster"] > 1


def test_long_rows_written_per_element_keep_their_cluster():
    """A softmax of 20000 columns writes every element: streamed it reads the row twice from memory, a
    cluster once (its CTAs of 256 threads re-read their shares from L2; the tuner's 512 hold them)."""
    p, ids = _reduce((256, 20000), "softmax", 1)
    ks = generate_multi_reduction(p, region_io(p, ids), "rows", {"sm_count": 2, "spread_min_bytes": 0})
    assert ks.params["schedule"] == "cluster" and ks.block == (256, 1, 1)
    held = generate_multi_reduction(p, region_io(p, ids), "rows",
                                    {"sm_count": 2, "spread_min_bytes": 0, "threads_per_row": 512})
    assert held.params["schedule"] == "cluster" and held.params["cached"]


@needs_gxx
def test_a_long_scan_takes_256_threads_per_row():
    p, ids = _reduce((3, 5000), "cumsum", 1)
    ks = _emulated(p, ids, {})
    assert ks.params["threads_per_row"] == 256


def _column_stats(shape):
    """Mean, max and min over dim 0: three column reductions sharing one input (a calibration observer)."""
    p = Program("stats")
    x = p.add_input("x", shape)
    ids = []
    for op in ("mean", "amax", "amin"):
        n = p.add_node(op, [x.id], {"dim": [0]})
        p.mark_output(n.outputs[0])
        ids.append(n.id)
    return p, ids


@needs_gxx
@pytest.mark.parametrize("shape,split", [((300, 64), 5), ((301, 40), 11)], ids=["float4", "ragged"])
def test_a_split_columns_last_block_combines_with_every_thread_row(shape, split):
    p, ids = _column_stats(shape)
    ks = _emulated(p, ids, {"split": split})      # _emulate_region checks the counters are left zeroed
    assert ks.params["schedule"] == "split_column" and ks.params["split"] == split
    assert "for (int k = threadIdx.y; k < kSplit; k += kTileY)" in ks.source


@pytest.mark.parametrize("rows,cols,schedule", [
    (128, 32768, "cluster"),       # a 2-CTA cluster holds each row: no chunks (H200: 11.5 us, 4 chunks 13.8)
    (128, 475200, "split_row"),    # too long for a cluster's registers: chunks over the GPU
    (60, 32768, "split_row"),      # fewer rows than half the SMs: chunks
    (200, 32768, "split_row"),     # more rows than SMs, fewer than 2 per SM, streamed: chunks
])
def test_rows_a_cluster_holds_split_only_below_half_the_sms(rows, cols, schedule):
    p, ids = _reduce((rows, cols), "sum", -1)
    ks = generate_multi_reduction(p, region_io(p, ids), "rows", {"sm_count": 132})
    assert ks.params["schedule"] == schedule, ks.schedule
    compile_kernel(ks, arch="sm_90")
