"""Column reductions with loads in flight (codegen/column_tile.py, rowkernel.py's column schedules).

DINO's teacher target (standardize over dim 0, then a softmax over dim 1) ran at 24% of its floor on
the H200 at 9c9edc0: the column statistics kernel folded each element as it arrived, one 4-byte
load outstanding per thread (ptxas: one ld.global.nc.f32 per loop trip, then Welford's div.rn), and
read the column twice (once for the statistics, once for the outputs). Now a column the region
writes per element is held in registers by a taller tile (16 thread rows of 16 values at DINO's
256), its loads all issued before the first fold; a streamed column loads kBatch elements at a
time; the split column's float4 loads likewise (CBAM's mean and max over channels).

CPU: the blocks plan (as `stitchcuda plan` does) at their real size into the new tiles, which compile for sm_90
without spills (tuner variants too); the PTX of a streamed column issues kBatch loads before its
first fold; each kernel run by the CPU emulator matches torch at 1e-4 over several draws, on the two
blocks (small sizes) and on programs of other shapes (ragged columns, partial tiles and batches, a
3-D standardize over a middle dim, a population variance). GPU: tests/gpu/test_gpu_column_tiles.py.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests import planned

ROOT = Path(__file__).resolve().parent.parent
GUARD = 64
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulator needs g++")


def _compiles(ks):
    c = compile_kernel(ks, arch="sm_90")
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []
    assert c.spill_stores == 0 and c.spill_loads == 0, c.summary()
    return c


def _kernel_regions(p):
    return [r for r in p.regions if r.schedule.get("runs") == "kernel"]


def test_dino_column_statistics_hold_the_column_and_cbam_streams_with_loads_in_flight(tmp_path):
    """At the real sizes, planned as `stitchcuda plan` plans them: DINO's statistics kernel (256-long columns; the
    standardisation is computed in the softmax's kernel, planner/tails.py, so it writes only the two
    [1, 65536] statistics) streams each column once, 8 thread rows with 4 loads in flight per thread;
    CBAM's mean and max over 256 channels stay a split column, 4 float4 loads in flight per thread.
    Every tuner variant of both generates and compiles."""
    _, p = planned.plan(planned.block("standardize_softmax_dino_teacher"), small=False)
    r1 = next(r for r in _kernel_regions(p) if any(p.nodes[n].op == "std" for n in r.nodes))
    ks = generate_kernel(p, r1.nodes, name="dino_stats")
    assert [p.values[v].shape for v in ks.outputs] == [(1, 65536), (1, 65536)]
    assert ks.params["schedule"] == "column" and not ks.params["cached"] and ks.params["tile_y"] == 8
    assert ks.block == (32, 8, 1) and ks.grid == (65536 // 32, 1, 1)
    assert "constexpr int kBatch = 4;" in ks.source and "the row read 1 times" in ks.schedule
    _compiles(ks)
    variants = [v for v in tune_space(ks) if "tile_y" in v or "column_batch" in v]
    assert {v.get("tile_y") for v in variants} >= {16} and {v.get("column_batch") for v in variants} >= {2, 8}
    for v in variants:
        alt = generate_kernel(p, r1.nodes, name="dino_stats", params=v)
        assert alt.block == (32, v.get("tile_y", 8), 1)
        _compiles(alt)

    _, p = planned.plan(planned.block("spatial_attention_cbam"), small=False)
    r1 = next(r for r in _kernel_regions(p) if any(p.nodes[n].op == "max" for n in r.nodes))
    ks = generate_kernel(p, r1.nodes, name="cbam_stats")
    assert ks.params["schedule"] == "split_column" and ks.params["vecx"] == 4 and ks.params["column_batch"] == 4
    assert "constexpr int kBatch = 4;" in ks.source
    _compiles(ks)
    for v in [v for v in tune_space(ks) if "column_batch" in v]:
        _compiles(generate_kernel(p, r1.nodes, name="cbam_stats", params=v))


def _ptx(ks) -> str:
    """The kernel's PTX from nvcc (the loads it issues, in order)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from tempfile import TemporaryDirectory
    with TemporaryDirectory() as d:
        src = Path(d) / "k.cu"
        src.write_text(ks.source)
        subprocess.run(["nvcc", "-arch=sm_90", "-ptx", "-o", str(Path(d) / "k.ptx"), str(src)],
                       check=True, capture_output=True, timeout=300)
        return (Path(d) / "k.ptx").read_text()


def _first_loop_loads(ptx: str) -> int:
    """Global loads from the first loop's head to the first floating-point op that folds them."""
    body = ptx[ptx.index("$L__BB0_"):]
    fold = re.search(r"\n\s*(add|max|sub|fma)\.[a-z0-9.]*f32", body)
    return len(re.findall(r"ld\.global\.nc", body[:fold.start()]))


def centred(shape, dim=0):
    """(x - mean(x, dim)) / std(x, dim): column statistics the region writes per element."""
    p = Program("centred")
    x = p.add_input("x", shape)
    m = p.add_node("mean", [x.id], {"dim": [dim], "keepdim": True})
    s = p.add_node("std", [x.id], {"dim": [dim], "keepdim": True})
    d = p.add_node("sub", [x.id, m.outputs[0]])
    q = p.add_node("div", [d.outputs[0], s.outputs[0]])
    p.mark_output(q.outputs[0])
    return p, [m.id, s.id, d.id, q.id]


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_a_streamed_column_issues_its_batch_of_loads_before_the_first_fold(batch):
    """Columns of 1000 written per element (standardised over dim 0): too long to hold, so streamed.
    The PTX loads `batch` elements before it folds any (batch 1 is the 9c9edc0 loop: one)."""
    p, ids = centred((1000, 64))
    ks = generate_kernel(p, ids, name="centred", params={"column_batch": batch})
    assert ks.params["schedule"] == "column" and not ks.params["cached"] and ks.params["tile_y"] == 8
    assert _first_loop_loads(_ptx(ks)) == batch
    _compiles(ks)


def standardize_softmax_src(shape, dim, temperature, var=False):
    """A KernelBench-format module: standardise over `dim`, then a softmax over the last dim."""
    stat = (f"x.var(dim={dim}, keepdim=True, unbiased=False).sqrt()" if var
            else f"x.std(dim={dim}, keepdim=True)")
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                z = (x - x.mean(dim={dim}, keepdim=True)) / ({stat} + 1e-5)
                return torch.softmax(z / {temperature}, dim=-1)

        def get_inputs():
            return [torch.randn{tuple(shape)}]

        def get_init_inputs():
            return []
        """)


def _emulate_region(p, r, env, params=None, draws_in=None, ks=None):
    """One region's kernel (`ks`, else generated) on the CPU emulator, its inputs from `env` (what ran
    before it): its outputs, and the workspace counters after the call (left zeroed for the next launch)."""
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import CANARY, guarded, payload
    ks = ks or generate_kernel(p, r.nodes, name=f"emu_{r.id}", params=params)
    call = [guarded(env[v].numpy(), GUARD) for v in ks.inputs]
    np_dtype = {v: np.dtype(torch.empty(0, dtype=getattr(torch, p.values[v].dtype)).numpy().dtype) for v in ks.outputs}
    call += [guarded(np.full(p.values[v].shape, 7, np_dtype[v]), GUARD) for v in ks.outputs]
    call += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.uint32), GUARD) for dt, n in ks.workspace]
    (res,) = CpuExecutor().run(ks, [call], guard=GUARD, timeout_s=300)
    assert all((b[:GUARD] == CANARY).all() and (b[-GUARD:] == CANARY).all() for b in res), "wrote outside a buffer"
    outs = {v: torch.from_numpy(payload(res[len(ks.inputs) + j], GUARD, np_dtype[v], p.values[v].shape).copy())
            for j, v in enumerate(ks.outputs)}
    if ks.workspace:
        assert not payload(res[-1], GUARD, np.uint32, (ks.workspace[-1][1],)).any(), "counters left raised"
    return ks, outs


def _emulate_plan(p, ins, params=None):
    """The planned program with every generated region emulated in plan order, each fed by the
    emulated outputs before it (a library region runs its reference): the program's outputs."""
    env = run_reference(p, ins, keep=True)
    kernels = []
    for r in p.regions:
        if r.schedule.get("runs") != "kernel":
            continue
        ks, outs = _emulate_region(p, r, env, (params or {}).get(r.id))
        env.update(outs)
        kernels.append(ks)
    return kernels, [env[v] for v in p.outputs]


def _draws(p, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.values[v].shape, generator=g) * 3 + 1 for v in p.inputs] for _ in range(n)]


@needs_gxx
def test_the_dino_block_emulated_end_to_end_matches_torch(tmp_path):
    """The block at its small size (16 views x 512 prototypes), both kernels chained on the CPU
    emulator, against the block's own torch forward over 3 draws at 1e-4."""
    _, p = planned.plan(planned.block("standardize_softmax_dino_teacher"), small=True)
    assert len(_kernel_regions(p)) == 2
    for ins in _draws(p, 3):
        kernels, (got,) = _emulate_plan(p, ins)
        x = ins[0]
        want = torch.softmax((x - x.mean(0, keepdim=True)) / (x.std(0, keepdim=True) + 1e-5) / 0.04, dim=-1)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert kernels[0].params["schedule"] == "column" and kernels[0].params["cached"]


def column_loss(classes, samples):
    """Cross entropy down the columns of y [C, N] (CLIP's loss over logits.t(), as lowered): the
    log_softmax of y viewed [1, C, N] over dim 1, and nll_loss against [1, N] targets (mean)."""
    p = Program("column_loss")
    y = p.add_input("y", (classes, samples))
    t = p.add_input("t", (samples,), "int64", init={"kind": "randint", "low": 0, "high": classes})
    y3 = p.add_node("reshape", [y.id], {"shape": [1, classes, samples]})
    t2 = p.add_node("reshape", [t.id], {"shape": [1, samples]})
    ls = p.add_node("log_softmax", [y3.outputs[0]], {"dim": 1})
    nl = p.add_node("nll_loss", [ls.outputs[0], t2.outputs[0]], {"reduction": "mean", "ignore_index": -100})
    p.mark_output(nl.outputs[0])
    return p, [y3.id, t2.id, ls.id, nl.id]


@needs_gxx
def test_a_streamed_column_with_fewer_tiles_than_sms_takes_32_thread_rows():
    """4096 columns of 4096 classes are 128 tiles of 32 columns on 132 SMs: one block per SM, so 8
    thread rows would leave 8 warps of loads in flight per SM. Past spread_min_bytes the tile takes 32
    rows (1024 threads); a tuner's tile_y and small regions keep theirs. Emulated, it equals torch."""
    from types import SimpleNamespace
    p, ids = column_loss(4096, 4096)
    ks = generate_kernel(p, ids, name="cl")
    assert ks.params["schedule"] == "column" and ks.params["tile_y"] == 32 and ks.block == (32, 32, 1)
    assert ks.grid == (128, 1, 1)
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.stack_bytes == 0, c.summary()
    assert {"tile_y": 8} in [{k: v for k, v in o.items() if k != "sm_count"} for o in tune_space(ks)]
    assert generate_kernel(p, ids, name="cl", params={"tile_y": 8}).params["tile_y"] == 8
    small, sids = column_loss(96, 64)
    assert generate_kernel(small, sids, name="cl").params["tile_y"] == 8      # 24 KB: the launch dominates
    g = torch.Generator().manual_seed(1)
    ins = [torch.randn(96, 64, generator=g) * 3, torch.randint(0, 96, (64,), generator=g)]
    env = run_reference(small, ins, keep=True)
    ks, outs = _emulate_region(small, SimpleNamespace(id="cl", nodes=sids), env, {"spread_min_bytes": 0})
    assert ks.params["tile_y"] == 32 and ks.block == (32, 32, 1)
    (v, got), = outs.items()
    torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)
