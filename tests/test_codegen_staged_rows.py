"""A row kernel whose prologue reads its rows through a transposing view stages them in shared memory
(codegen/row_stage.py, layout_graph.ViewPrologue.transposed).

ViT's token assembly, patches.flatten(2).transpose(1, 2) -> cat(class token) -> + pos -> layer_norm,
reads element (token, channel) of the patches at channel * 196 + token: read row by row, each load
takes a 32-byte sector of its own and the 7 rows beside it take the same sectors again (38% of the
copy floor on the H200 at 9c9edc0, 0.87x Inductor). Staged, the block reads its 8 rows with the row
index fastest (8 tokens share each sector), then each warp reads its row from shared memory as float4,
and the tokens the program also returns are stored as float4.

CPU: the block plans into the same one kernel and it compiles through NVRTC, staged and not; the
staged kernel run by the CPU emulator matches torch on several shapes (odd widths, a partial last
block, rows crossing the batch); the sectors its loads touch against the bytes-read-once floor.
GPU (`-m gpu`, tests/gpu/test_gpu_staged_rows.py): the same kernels against torch over 5 draws.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.reference import run_reference
from tests import planned
from tests.test_codegen_layout_rows import _all, permute_softmax, vit_tokens

GUARD = 64
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulator needs g++")


def _compiles(ks):
    c = compile_kernel(ks, arch="sm_90")
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []
    assert c.spill_stores == 0, c.summary()


def test_the_vit_block_plans_into_one_staged_kernel_and_both_variants_compile():
    """Planned as `stitchcuda plan` plans it, at the real size (planning only; no tensors): the same
    one kernel as before, now staged, and the tuner's unstaged variant still generates and compiles."""
    from agent_core.codegen.row_tuning import tune_variants
    plan, p = planned.plan(planned.block("vit_patch_embed_pos_layernorm"), small=False)
    assert plan["kernels"] == 1
    (r,) = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    ks = generate_kernel(p, r.nodes, name="vit")
    assert ks.params["staged"] and ks.params["rows_per_block"] == 8
    assert "kTileStride = 772" in ks.source and "extern __shared__ float4 stage_smem[];" in ks.source
    assert "reinterpret_cast<float4*>(out0 + base + p)[0] = float4{" in ks.source  # tokens as float4
    _compiles(ks)
    variants = tune_variants(ks.params)
    assert {"stage": False} in [{k: v for k, v in o.items() if k != "sm_count"} for o in variants]
    plain = generate_kernel(p, r.nodes, name="vit", params={"stage": False})
    assert not plain.params["staged"] and "kTileStride" not in plain.source
    _compiles(plain)


def test_only_transposing_reads_are_staged():
    """A prologue whose rows are contiguous is read as before; so is one over rows too long for a
    warp-per-row block (no 8 rows to share a sector)."""
    from tests.test_codegen_layout_rows import bert_embed, slice_rms_norm
    for p in (bert_embed(2, 16, 50, 48), slice_rms_norm((6, 5, 80), 8, 64)):
        assert not generate_kernel(p, _all(p), name=p.name).params["staged"], p.name
    long_rows = permute_softmax((2, 4096, 8))     # rows of 4096: a block per row
    assert not generate_kernel(long_rows, _all(long_rows), name="long").params["staged"]


def _sectors(offsets: np.ndarray) -> int:
    """32-byte sectors the float32 loads of each warp instruction (a row of `offsets`) touch, summed;
    negative offsets (the class token, another input) touch none of the patches."""
    return sum(len(np.unique(w[w >= 0] // 8)) for w in offsets)


@pytest.mark.parametrize("block,bound", [(None, 2.1), (1024, 1.3)], ids=["8-rows", "32-rows"])
def test_staged_loads_touch_near_the_floor_of_sectors_the_row_order_eight_times_it(block, bound):
    """The offsets into the patches each warp load instruction reads, from torch's own layout ops (an
    arange through flatten, transpose and cat) in the order the kernel reads them, at ViT-B/16's
    size: against the bytes-read-once floor (bytes / 32 sectors), the row order touches 8 times
    it (a sector per element), the staged order 2 times with 8 rows per block (a run of 8 tokens not
    starting at a multiple of 8 spans 2 sectors) and 1.25 times with 32 (the tuner's variant)."""
    b, d, g = 4, 768, 14
    idx = torch.arange(b * d * g * g, dtype=torch.float64).reshape(b, d, g, g)
    tokens = torch.cat((torch.full((b, 1, d), -1.0, dtype=torch.float64), idx.flatten(2).transpose(1, 2)), dim=1)
    flat = tokens.reshape(-1, d).numpy().astype(np.int64)  # [rows, cols]: the patches element each reads
    p = vit_tokens(b, d, g)
    ks = generate_kernel(p, _all(p), name="vit", params={"block": block} if block else None)
    assert ks.params["staged"]
    r_blk = ks.params["rows_per_block"]
    rows = flat.shape[0] - flat.shape[0] % r_blk
    # staged: thread s_t of a block reads (row s_t % R, column s_t / R), a warp 32 consecutive s_t
    staged = flat[:rows].reshape(-1, r_blk, d).transpose(0, 2, 1).reshape(-1, 32)
    # row order: lane l of the warp of row r loads columns 4l .. 4l + 3, one element per instruction
    row_order = flat[:rows].reshape(rows, -1, 32, 4).transpose(0, 1, 3, 2).reshape(-1, 32)
    floor = (flat[:rows] >= 0).sum() * 4 / 32
    assert _sectors(row_order) >= 7.5 * floor
    assert _sectors(staged) <= bound * floor, (_sectors(staged) / floor, bound)
    _compiles(ks)


def _emulated(p, params=None, generate=None):
    """The region's kernel (`generate(program, io, name, params)`, else the package's dispatch) run by
    the CPU emulator, its outputs checked against torch."""
    from agent_core.codegen.region_io import region_io
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import CANARY, guarded, payload
    from agent_core.codegen.cuda import prune_unused
    if generate:         # pruned of unused helpers, as generate_kernel does
        ks = generate(p, region_io(p, _all(p)), "staged", params)
        ks.source = prune_unused(ks.source)
    else:
        ks = generate_kernel(p, _all(p), name="staged", params=params)
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    bufs = [guarded(env[v].numpy(), GUARD) for v in ks.inputs]
    bufs += [guarded(np.full(p.values[v].shape, 7, np.float32), GUARD) for v in ks.outputs]
    (res,) = CpuExecutor().run(ks, [bufs], guard=GUARD, timeout_s=120)
    assert all((b[:GUARD] == CANARY).all() and (b[-GUARD:] == CANARY).all() for b in res), "wrote outside a buffer"
    for j, v in enumerate(ks.outputs):
        want = env[v].numpy()
        got = payload(res[len(ks.inputs) + j], GUARD, np.float32, want.shape)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=p.values[v].name)
    return ks


EMULATED = [("vit", vit_tokens, (3, 48, 4), None),       # 51 rows: a partial last block, rows across samples
            ("vit-odd-width", vit_tokens, (2, 37, 3), None),  # scalar tile reads
            ("vit-wide", vit_tokens, (2, 768, 3), None),      # ViT-B's width: 8 rows per block
            ("vit-wide-32-rows", vit_tokens, (2, 768, 3), {"block": 1024}),  # 98 KB of dynamic shared memory
            ("permute-softmax", permute_softmax, ((3, 24, 40),), None)]


@needs_gxx
@pytest.mark.parametrize("case,build,args,params", EMULATED, ids=[c[0] for c in EMULATED])
def test_staged_row_kernels_under_cpu_emulation_match_torch(case, build, args, params):
    p = build(*args)
    ks = _emulated(p, params)
    assert ks.shared_bytes == ks.params["rows_per_block"] * (ks.params["cols"] + (4 - ks.params["cols"] % 32) % 32) * 4
    assert ks.params["staged"], case
    _compiles(ks)


@needs_gxx
@pytest.mark.parametrize("case,build,args,params", EMULATED, ids=[c[0] for c in EMULATED])
def test_the_row_graph_stages_the_same_rows_under_cpu_emulation(case, build, args, params):
    """The row graph (rowkernel.py) stages the same transposing reads as rowreduce, so it can replace it
    on ViT's tokens and Swin's attention bias: staged, the same shared memory, equal to torch."""
    from agent_core.codegen.rowkernel import generate_multi_reduction
    p = build(*args)
    ks = _emulated(p, params, generate_multi_reduction)
    assert ks.params["staged"], case
    assert ks.shared_bytes == ks.params["rows_per_block"] * (ks.params["cols"] + (4 - ks.params["cols"] % 32) % 32) * 4
    _compiles(ks)
