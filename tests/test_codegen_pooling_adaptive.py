"""Adaptive pooling kernels (adaptive_{avg,max}_pool{1,2,3}d to any output size) on the CPU: they generate
with their prologue and epilogue fused and compile for sm_90 without warnings or spills; the window
bounds the kernel computes, evaluated in Python from the generated source, are torch's
[floor(i * In / Out), ceil((i + 1) * In / Out)) and pool to what torch's F.adaptive_*_pool gives;
global average pooling stays a row mean; the importer maps aten's (values, indices) adaptive_max_pool."""
import itertools
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.importers import import_file, import_nn_module, verify_import
from agent_core.ir import Program
from tests.programs import ADAPTIVE_CASES, emulated, pooled

EXAMPLE = Path(__file__).resolve().parent.parent / "resources" / "examples" / "adaptive_pool_mixed.py"

IDS = [f"{op}-{'x'.join(map(str, shape[-int(op[-2]):]))}-to-{'x'.join(map(str, out))}"
       for op, shape, out in ADAPTIVE_CASES]
TORCH = {f"adaptive_{k}_pool{d}d": getattr(F, f"adaptive_{k}_pool{d}d") for k in ("avg", "max") for d in (1, 2, 3)}


def _compiles_clean(ks):
    c = compile_kernel(ks, arch="sm_90")
    warnings = [ln for ln in c.log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)
    assert c.spill_stores == 0 and c.spill_loads == 0, c.summary()
    return c


@pytest.mark.parametrize("op,shape,out", ADAPTIVE_CASES, ids=IDS)
def test_adaptive_pool_with_prologue_and_epilogue_compiles(op, shape, out):
    p, ids = pooled(op, {"output_size": out}, shape)     # relu -> pool -> tanh
    ks = generate_kernel(p, ids, name=op)
    assert ks.kind == "pooling" and ks.node_ids == ids
    assert "point(" in ks.source and "store_point(pooled" in ks.source
    assert "floor(o * In / Out)" in ks.source and "ceil((o + 1) * In / Out)" in ks.source
    _compiles_clean(ks)


def _window_bounds(source: str, axes: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per axis, the start and end of every output index's window, from the kernel's own expressions
    (`const int s{ax} = ...;`, `const int e{ax} = ...;`): every operand is non-negative, so C's integer
    division is Python's //."""
    sizes = {m.group(1): int(m.group(2)) for m in re.finditer(r"\b(k(?:In|Out)[DHW]) = (\d+)", source)}
    bounds = []
    for ax in axes:
        exprs = [re.search(rf"const int {b}{ax} = (.*?);", source).group(1).replace("/", "//")
                 .replace("(long long)", "").replace("(int)", "") for b in "se"]
        n_out = sizes[f"kOut{ax.upper()}"]
        bounds.append(tuple(np.array([eval(e, {}, {**sizes, f"o{ax}": o}) for o in range(n_out)]) for e in exprs))
    return bounds


def _emulate(source: str, op: str, x: np.ndarray) -> np.ndarray:
    """The kernel's fold over its windows in numpy: max with NaN propagating, or sum / window size."""
    d = int(op[-2])
    bounds = _window_bounds(source, "dhw"[-d:])
    lead = x.shape[:-d]
    y = np.empty(lead + tuple(len(s) for s, _ in bounds), np.float32)
    for oc in itertools.product(*[range(len(s)) for s, _ in bounds]):
        win = x[(Ellipsis,) + tuple(slice(s[o], e[o]) for (s, e), o in zip(bounds, oc))].reshape(lead + (-1,))
        assert win.shape[-1] > 0
        if "max" in op:   # acc = -inf; if (xv > acc || xv != xv) acc = xv;
            acc = np.full(lead, -np.inf, np.float32)
            for k in range(win.shape[-1]):
                acc = np.where((win[..., k] > acc) | np.isnan(win[..., k]), win[..., k], acc)
        else:
            acc = win.sum(-1, dtype=np.float32) / np.float32(win.shape[-1])
        y[(Ellipsis,) + oc] = acc
    return y


@pytest.mark.parametrize("op,shape,out", ADAPTIVE_CASES, ids=IDS)
def test_generated_windows_are_torchs_and_pool_like_torch(op, shape, out):
    p, ids = pooled(op, {"output_size": out}, shape)
    src = generate_kernel(p, ids, name=op).source
    d = int(op[-2])
    for (start, end), n_in, n_out in zip(_window_bounds(src, "dhw"[-d:]), shape[-d:], out):
        i = np.arange(n_out)
        assert (start == np.floor(i * n_in / n_out)).all() and (end == np.ceil((i + 1) * n_in / n_out)).all()
    torch.manual_seed(0)
    x = torch.randn(shape)
    x.view(-1)[::11] = float("nan")   # max pooling propagates NaN, average pooling spreads it
    got = _emulate(src, op, x.numpy())
    want = TORCH[op](x, out).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)   # NaN where torch has NaN


def test_large_windows_use_64_bit_bounds():
    """(o + 1) * In overflows an int for 100000 -> 50000: the bounds are computed in 64 bits."""
    p, ids = pooled("adaptive_avg_pool1d", {"output_size": [50000]}, (1, 2, 100000))
    ks = generate_kernel(p, ids, name="wide")
    assert "(long long)ow * kInW" in ks.source
    (start, end), = _window_bounds(ks.source, "w")
    i = np.arange(50000, dtype=np.int64)
    assert (start == i * 100000 // 50000).all() and (end == -(-(i + 1) * 100000 // 50000)).all()
    _compiles_clean(ks)


def test_global_average_pooling_stays_a_row_mean_and_global_max_is_pooled():
    p, ids = pooled("adaptive_avg_pool2d", {"output_size": [1]}, (2, 8, 7, 7))
    assert generate_kernel(p, ids, name="gap").kind == "row_reduction"
    assert generate_kernel(p, ids, name="gap", kind="reduction").kind == "row_reduction"   # the planner's kind
    q, qids = pooled("adaptive_max_pool2d", {"output_size": [1]}, (2, 8, 7, 7))
    for kind in (None, "reduction", "single"):
        ks = generate_kernel(q, qids, name="gmp", kind=kind)
        assert ks.kind == "pooling"
    _compiles_clean(ks)


def test_planned_regions_of_the_example_generate():
    from agent_core.planner import apply_plan, plan_program
    p = import_file(EXAMPLE)
    apply_plan(p, plan_program(p))
    pools = [r for r in p.regions if any(p.nodes[n].op.startswith("adaptive") for n in r.nodes)]
    assert len(pools) == 2
    for r in pools:
        ks = generate_kernel(p, r.nodes, name=f"k_{r.id}", kind=r.kind)
        assert ks.kind == "pooling", ks.schedule
        _compiles_clean(ks)


# --- importer ----------------------------------------------------------------------------------
def test_example_imports_without_opaque_nodes():
    p = import_file(EXAMPLE)
    assert sorted(n.op for n in p.nodes.values()) == ["adaptive_avg_pool1d", "adaptive_max_pool2d"]
    assert not p.metadata.get("opaque_ops")


class AdaptiveMax(nn.Module):
    def forward(self, a, b, c):
        return F.adaptive_max_pool1d(a, 3), torch.relu(F.adaptive_max_pool2d(b, (2, 3))), F.adaptive_max_pool3d(c, 2)


class AdaptiveMaxIndices(nn.Module):
    def forward(self, x):
        values, idx = F.adaptive_max_pool2d(x, 3, return_indices=True)
        return values + 1.0, idx


def test_adaptive_max_pool_maps_to_the_library_op():
    m = AdaptiveMax()
    torch.manual_seed(0)
    p = import_nn_module(m, [torch.randn(2, 3, 7), torch.randn(2, 3, 7, 8), torch.randn(1, 2, 5, 6, 7)])
    p.check()
    ops = sorted(n.op for n in p.nodes.values())
    assert ops == ["adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "relu"]
    assert p.nodes[next(n for n in p.nodes if p.nodes[n].op == "adaptive_max_pool2d")].attrs["output_size"] == [2, 3]
    assert verify_import(p, m, draws=3) < 1e-4


def test_adaptive_max_pool_whose_indices_are_read_stays_opaque():
    m = AdaptiveMaxIndices()
    torch.manual_seed(0)
    p = import_nn_module(m, [torch.randn(2, 3, 7, 8)])
    p.check()
    opaque = [n for n in p.nodes.values() if n.op == "opaque"]
    assert len(opaque) == 1 and opaque[0].attrs["target"] == "aten.adaptive_max_pool2d.default"
    assert any("indices are read" in w for w in p.metadata["import_warnings"])
    assert [p.values[v].dtype for v in p.outputs] == ["float32", "int64"]
    assert verify_import(p, m, draws=3) < 1e-4


def test_a_region_of_two_adaptive_pools_is_one_kernel_of_window_lambdas_that_matches_torch():
    """An adaptive pool of an adaptive pool (windows that do not divide the input): each a lambda
    over its window in one layout-graph kernel (it was refused: one pool a region)."""
    p = Program("two")
    x = p.add_input("x", (2, 3, 9, 11))
    a = p.add_node("adaptive_max_pool2d", [x.id], {"output_size": [4]})
    b = p.add_node("adaptive_avg_pool2d", [a.outputs[0]], {"output_size": [3]})
    p.mark_output(b.outputs[0])
    ks = generate_kernel(p, [a.id, b.id], name="two")
    assert ks.kind == "pooling" and "auto adaptive_max_pool2d_at" in ks.source, ks.source
    got, want = emulated(p, ks, [torch.randn(2, 3, 9, 11)])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
