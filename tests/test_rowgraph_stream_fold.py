"""A streamed online softmax folds a step of elements at once (rowkernel.MAXSUMEXP_BLOCK: one max,
one rescale, an exp per element, no branch), in rows and in columns, and keeps torch's answers where
the values are not finite: rows that start with -inf (masked positions), a row all -inf, +inf and NaN
elements, and a ragged end. A conv's per-channel bias before a spatial mean is read once per row.

CPU: generated, compiled with NVRTC for sm_90 and run on the CPU emulator against torch.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agent_core.codegen.region_io import region_io
from agent_core.codegen.rowkernel import generate_multi_reduction
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx

# long rows streamed (never held in registers), enough of them for no split or cluster
STREAM = {"sm_count": 1, "register_max_cols": 256, "online_threads": 64, "spread_min_bytes": 0, "cluster": 1}


def _special(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows (along `dim`) of every awkward kind: random, -inf over the first half, all -inf, one +inf,
    one NaN, large values whose max moves late in the row."""
    t = t.movedim(dim, -1).clone()
    n = t.shape[-1]
    t[1, ..., : n // 2] = -torch.inf
    t[2] = -torch.inf
    t[3, ..., n // 3] = torch.inf
    t[4, ..., n // 5] = torch.nan
    t[5] = torch.linspace(-80.0, 90.0, n) + t[5]
    return t.movedim(-1, dim).contiguous()


def _check(shape, op, dim, params):
    p = Program("fold")
    x = p.add_input("x", shape)
    attrs = {"dim": dim} if op in ("softmax", "log_softmax") else {"dim": [dim]}
    n = p.add_node(op, [x.id], attrs)
    p.mark_output(n.outputs[0])
    ks = generate_multi_reduction(p, region_io(p, [n.id]), "fold", params)
    assert "fold_block_maxsumexp(" in ks.source
    compile_kernel(ks, arch="sm_90")
    ins = _special(torch.randn(shape, generator=torch.Generator().manual_seed(0)), dim)
    env = run_reference(p, [ins], keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=[n.id], id="r"), env, ks=ks)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5, equal_nan=True)
    return ks


@needs_gxx
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("cols", [4096, 4099])       # float4 steps, and scalar loads with a ragged end
def test_a_streamed_row_folds_a_step_at_once_and_keeps_torchs_special_values(op, cols):
    ks = _check((8, cols), op, -1, STREAM)
    assert ks.params["schedule"] == "stream" and not ks.params["cached"]


@needs_gxx
def test_a_streamed_column_folds_a_batch_at_once_and_keeps_torchs_special_values():
    # classes on dim 1, read once and not held: one batch of kBatch loads folded at a time (DeepLab's
    # log_softmax -> nll_loss, the same pass: test_rowgraph_stream_schedules.py)
    ks = _check((6, 19, 512), "logsumexp", 1, {"sm_count": 1})
    assert ks.params["schedule"] == "column" and not ks.params["cached"]


@needs_gxx
def test_a_per_channel_bias_before_a_spatial_mean_is_read_once_per_row():
    p = Program("pool")
    x = p.add_input("x", (2, 3, 40, 40))
    b = p.add_input("b", (3, 1, 1))
    add = p.add_node("add", [x.id, b.id])
    g = p.add_node("gelu", [add.outputs[0]])
    m = p.add_node("mean", [g.outputs[0]], {"dim": [2, 3]})
    p.mark_output(m.outputs[0])
    ids = [add.id, g.id, m.id]
    ks = generate_multi_reduction(p, region_io(p, ids), "pool", STREAM)
    # the bias's load sits before the row's pass, not inside it
    body = ks.source[ks.source.index("extern"):]
    assert body.index("b[") < body.index("for (int p0")
    env = run_reference(p, [torch.randn(2, 3, 40, 40), torch.randn(3, 1, 1)], keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=ids, id="r"), env, ks=ks)
    torch.testing.assert_close(outs[m.outputs[0]], env[m.outputs[0]], atol=1e-5, rtol=1e-5)
