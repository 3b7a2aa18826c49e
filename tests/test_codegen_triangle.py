"""tril / triu as index predicates folded into the kernel that reads them (issue #17).

A triangular mask is a `Triangle` layer of codegen/views.py: a validity test col - row <= k (tril) or
>= k (triu) on the last two dims, 0 where it fails. So tril / triu are layout-graph ops like a pad:
they fuse with their pointwise neighbours, and a masked_fill by a tril mask of ones (Mamba2's segment
sum: x[..., :, None] - x[..., None, :], masked to -inf, exp) is one kernel with the subtraction, the
mask and the exp. Before, tril ran through torch as its own region (KernelBench 48: 19 kernels against
Inductor's 16; 49: 12 against 8).

CPU: the views rendered in Python against torch over compositions (views under and over the triangle,
every diagonal offset that matters); a small program planned as the CLI plans it (`plan --json
--no-rewrite`, as the GPU path plans when its rewrites do not hold) puts each tril / triu and what
follows in one region, which generates, compiles with NVRTC for sm_90 and, under the CPU emulator,
matches torch on several draws of large magnitude, with exact zeros where exp reads -inf; the
segment sum with a non-contiguous mask read; KernelBench 48 / 49 at their sizes: every proposed region
generates and compiles, the segment sums are one kernel each, and fewer kernels are planned.
GPU side: tests/gpu/test_gpu_segment_sum.py."""
from __future__ import annotations

import itertools
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.codegen import views as V
from agent_core.compiler import compile_kernel
from agent_core.reference import run_reference
from tests.test_scan_exact import _planned_scan, emulate

ROOT = Path(__file__).resolve().parent.parent
LEVEL3 = ROOT / "kernelbench" / "KernelBench" / "level3"
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


# --- the views ----------------------------------------------------------------------------------
def _python_values(lay: V.Layout, src: torch.Tensor) -> torch.Tensor:
    """The layout evaluated element by element from its Python rendering."""
    text = V.render_layout(lay, "i", lang="python", fill=float("nan"))
    flat = src.reshape(-1).tolist()
    fn = eval(f"lambda i, m: {text}")    # noqa: S307: our own rendering of an index expression
    return torch.tensor([fn(i, flat) for i in range(math.prod(lay.shape))]).reshape(lay.shape)


CASES = {   # name -> (input shape, layout builder, torch of the same)
    "tril": ((5, 7), lambda x: V.triangle(x, 0, True), lambda t: torch.tril(t)),
    "triu k=2": ((3, 6, 4), lambda x: V.triangle(x, 2, False), lambda t: torch.triu(t, 2)),
    "tril k=-3 (all but a corner zero)": ((4, 4), lambda x: V.triangle(x, -3, True), lambda t: torch.tril(t, -3)),
    "tril of a transpose": ((6, 5), lambda x: V.triangle(V.permute(x, (1, 0)), 1, True),
                            lambda t: torch.tril(t.t(), 1)),
    "triu of a broadcast mask": ((1, 5, 5), lambda x: V.triangle(V.expand(x, (3, 5, 5)), 0, False),
                                 lambda t: torch.triu(t.expand(3, 5, 5))),
    "tril of a slice": ((8, 9), lambda x: V.triangle(V.slice_(x, 1, 2, 8), -1, True),
                        lambda t: torch.tril(t[:, 2:8], -1)),
    "reshape of a tril": ((2, 4, 6), lambda x: V.reshape(V.triangle(x, 0, True), (8, 3, 2)),
                          lambda t: torch.tril(t).reshape(8, 3, 2)),
    "permute of a triu": ((2, 3, 5), lambda x: V.permute(V.triangle(x, 1, False), (2, 0, 1)),
                          lambda t: torch.triu(t, 1).permute(2, 0, 1)),
    "tril of a triu (a band)": ((6, 6), lambda x: V.triangle(V.triangle(x, -1, False), 1, True),
                                lambda t: torch.tril(torch.triu(t, -1), 1)),
    "cat then tril": ((3, 4), lambda x: V.triangle(V.cat([x, V.flip(x, [1])], 1), 0, True),
                      lambda t: torch.tril(torch.cat([t, t.flip(1)], 1))),
}


@pytest.mark.parametrize("case", CASES)
def test_triangle_views_match_torch(case):
    shape, build, ref = CASES[case]
    src = torch.arange(1, math.prod(shape) + 1, dtype=torch.float64).reshape(shape)
    lay = build(V.Layout.of("m", shape))
    got = _python_values(lay, src)
    assert torch.equal(got, ref(src)), (case, got, ref(src))


def test_every_diagonal_offset_keeps_what_torch_keeps():
    for (r, c), k, lower in itertools.product([(4, 4), (3, 6), (6, 3)], range(-7, 8), (True, False)):
        src = torch.arange(1, r * c + 1, dtype=torch.float64).reshape(r, c)
        got = _python_values(V.triangle(V.Layout.of("m", (r, c)), k, lower), src)
        assert torch.equal(got, (torch.tril if lower else torch.triu)(src, k)), (r, c, k, lower)


# --- a program planned as the CLI plans it -------------------------------------------------------
PROGRAM = '''
import torch

class Model(torch.nn.Module):
    """tril of computed values with an epilogue, and a segment sum masked by a triu mask of ones."""
    def forward(self, x, s):
        a = torch.tril(torch.exp(s), diagonal=-1) * 2.0 + 1.0
        n = x.shape[-1]
        keep = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=0).t()     # a transposed read
        c = torch.cumsum(x, dim=-1)
        b = torch.exp((c[..., :, None] - c[..., None, :]).masked_fill(~keep, -torch.inf))
        return a, b

def get_inputs():
    return [torch.randn(2, 3, 24), torch.randn(2, 3, 24, 24)]

def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`stitchcuda plan --no-rewrite` of the program (tests/planned.py): its JSON and planned program."""
    from tests.planned import plan
    d = tmp_path_factory.mktemp("tri")
    (d / "tri.py").write_text(PROGRAM)
    return plan(d / "tri.py", rewrite=False)


def test_tril_and_triu_fuse_with_what_follows(planned):
    plan, p = planned
    ops = {r["id"]: [p.nodes[n].op for n in r["nodes"]] for r in plan["regions"]}
    tri = {rid: o for rid, o in ops.items() if {"tril", "triu"} & set(o)}
    assert len(tri) == 2, ops
    first = next(o for o in tri.values() if "tril" in o)
    assert {"exp", "tril", "mul_scalar", "add_scalar"} <= set(first) or {"exp", "tril"} <= set(first), first
    second = next(o for o in tri.values() if "triu" in o)
    # the mask, the subtraction of the running sums, the fill and the exp: one kernel
    assert {"triu", "sub", "exp"} <= set(second) and ({"where"} & set(second) or {"masked_fill"} & set(second)), second
    for rid in tri:
        region = next(r for r in plan["regions"] if r["id"] == rid)
        assert region["schedule"]["runs"] == "kernel", region


@needs_gxx
def test_planned_triangle_kernels_compile_and_match_torch(planned):
    plan, p = planned
    regions = [r for r in plan["regions"] if {"tril", "triu"} & {p.nodes[n].op for n in r["nodes"]}]
    for r in regions:
        ks = generate_kernel(p, r["nodes"], name=f"tri_{r['id']}")
        op = "tril" if "tril" in {p.nodes[n].op for n in r["nodes"]} else "triu"
        # one layout-graph kernel reading through the triangle's view: a lambda of it, or each packed
        # lane composed down to its loads under the triangle's test (col - row against the diagonal)
        assert ks.kind == "layout" and op in ks.params["chain"]
        assert re.search(rf"// \w+: {op}\(diagonal=-?\d\) .* read through its view", ks.source) or \
            re.search(r"\(\S[^()?]* - [^()?]* [<>]=? -?\d+\) \? ", ks.source), ks.source
        assert compile_kernel(ks, arch="sm_90").spill_stores == 0
        for seed, scale in ((0, 1.0), (1, 30.0), (2, 80.0)):     # exp of up to e^80: no overflow in the kept part
            g = torch.Generator().manual_seed(seed)
            inputs = [torch.randn(p.values[v].shape, generator=g) * scale for v in p.inputs]
            inputs[1] = inputs[1].clamp(max=80.0)
            env = run_reference(p, inputs, keep=True)
            got = emulate(ks, env, p)
            for v, t in got.items():
                want = env[v]
                assert torch.equal(torch.isinf(t), torch.isinf(want)) and not torch.isnan(t).any(), (r["id"], seed)
                assert torch.equal(t == 0, want == 0), (r["id"], seed)         # exact zeros where masked
                fin = torch.isfinite(want)
                assert torch.allclose(t[fin], want[fin], rtol=2e-6, atol=0), (r["id"], seed)


# --- KernelBench level 3, 48 / 49 at their sizes ------------------------------------------------
@pytest.mark.skipif(not LEVEL3.is_dir(), reason="kernelbench/ is absent (not part of the repository)")
@pytest.mark.parametrize("problem,most", [("48_Mamba2ReturnY", 15), ("49_Mamba2ReturnFinalState", 10)])
def test_mamba2_regions_generate_and_compile(problem, most):
    """Planned as the GPU path plans it when rewrites are off, every region that is not a library call
    or a view generates and compiles; each segment sum (sub, tril, where, exp) is one kernel."""
    from agent_core.importers.isolated import import_isolated
    from agent_core.planner import apply_plan, plan_program
    from agent_core.compiler import prefetch
    p = import_isolated(str(LEVEL3 / f"{problem}.py"), timeout=120, weights=False)
    plan = plan_program(p)
    apply_plan(p, plan)
    assert plan.kernels <= most, plan.kernels       # was 19 and 12 with tril through torch
    kernels, segment_sums = [], 0
    for r in plan.active:
        ops = [p.nodes[n].op for n in r.nodes]
        if r.schedule.get("runs") in ("alias", "library"):
            continue
        ks = generate_kernel(p, r.nodes, name=f"{problem[:2]}_{r.id}", kind=r.kind)
        kernels.append(ks)
        if "tril" in ops:
            assert {"sub", "where", "exp"} <= set(ops), ops
            segment_sums += 1
    assert segment_sums == (2 if problem.startswith("48") else 1)
    prefetch(kernels, arch="sm_90")
    for ks in kernels:
        assert compile_kernel(ks, arch="sm_90").spill_stores == 0, ks.name


def test_rewritten_chunked_scan_regions_all_generate():
    """Rewritten (the tril of ones folds into a constant mask, each einsum becomes torch's own bmm's
    and views: rewrites/einsum.py) and planned, every region of the chunked scan that is not a
    library call or a view alone generates: the segment sum's x[..., :, None] - x[..., None, :]
    reads one input through two relabels, which the pointwise generator cannot index, and is a
    layout graph; so is an add followed by a reshape."""
    _, _, prog, plan = _planned_scan(2, 32, 2, 4, 4, 16)
    ops = {op for r in plan.active for op in (prog.nodes[n].op for n in r.nodes)}
    assert "einsum" not in ops and "bmm" in ops
    generated = 0
    for r in plan.active:
        if r.schedule.get("runs") in ("alias", "library"):
            continue
        generate_kernel(prog, r.nodes, name=f"ssd_{r.id}", kind=r.kind)
        generated += 1
    assert generated >= 10
