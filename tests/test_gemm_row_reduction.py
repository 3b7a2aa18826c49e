"""Row reductions inside the tile GEMM (codegen/gemm_rows.py): GEMM -> pointwise -> sum / max / mean /
logsumexp (and var) over the output's last dim as one kernel. The kernel body, with plain-C++
tensor-core helpers, runs in the CPU emulator and matches torch at 1e-4 on ragged M, N, K, with and
without bias, for each reduction, on several draws, with one CTA per row and with several whose last
one combines the row (its tickets left zeroed); the full output is stored only when the program reads
it; a second pass over the output (x - max) and column reductions are refused with the reason. The
planner proposes GEMM -> pointwise -> reduction as one region with this form beside cuBLAS + the
epilogue kernel, costed from the very kernel it generates; `optimize --cpu` compiles it."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from agent_core.analysis.gpu import H200
from agent_core.codegen import CodegenError, generate_kernel
from agent_core.codegen.gemm_mma import FORM, gemm_supported
from agent_core.ir import Program

torch = pytest.importorskip("torch")
GUARD = 256


def program(M, N, K, reds, *, op="linear", bias=True, keep_full=False, keepdim=False, post=False, seed=0,
            lead=None):
    """x [M, K] (or [*lead, M, K]) -> linear (bias) or matmul -> gelu -> each reduction of `reds` over
    the last dim; keep_full: gelu's output is a program output too; post: the first reduction's result
    scaled by a per-row input and shifted by 0.5 (ops over the row results)."""
    p = Program("gemm_rows")
    shape = (*(lead or ()), M, K)
    x = p.add_input("x", shape)
    rng = np.random.default_rng(seed)
    if op == "linear":
        ins = [x.id, p.add_parameter("w", (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)).id]
        if bias:
            ins.append(p.add_parameter("b", rng.standard_normal(N).astype(np.float32)).id)
        y = p.add_node("linear", ins).outputs[0]
    else:
        y = p.add_node("matmul", [x.id, p.add_parameter("w", (rng.standard_normal((K, N)) / np.sqrt(K))
                                                        .astype(np.float32)).id]).outputs[0]
    g = p.add_node("gelu", [y]).outputs[0]
    if keep_full:
        p.mark_output(g)
    outs = []
    for red in reds:
        outs.append(p.add_node(red, [g], {"dim": [-1], "keepdim": keepdim}).outputs[0])
    if post:
        rowin = p.add_input("rowscale", tuple(p.values[outs[0]].shape))
        m = p.add_node("mul", [outs[0], rowin.id]).outputs[0]
        outs[0] = p.add_node("add_scalar", [m], {"value": 0.5}).outputs[0]
    for v in outs:
        p.mark_output(v)
    return p


def emulate(p, params, draws=3):
    """The kernel run in the CPU emulator on `draws` random inputs: (ks, [(got, want) per output per
    draw], the workspace tickets after each call)."""
    from agent_core.reference import run_reference
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    ks = generate_kernel(p, list(p.nodes), name="gemm_rows_emu", params={"form": FORM, "portable": True, **params})
    calls, wants = [], []
    for draw in range(draws):
        torch.manual_seed(draw)
        ins = [torch.randn(p.values[v].shape) * (3.0 if k == 0 else 1.0) for k, v in enumerate(p.inputs)]
        env = run_reference(p, ins, keep=True)
        call = [guarded(env[v].contiguous().numpy(), GUARD) for v in ks.inputs]
        call += [guarded(np.zeros(p.values[v].shape, np.float32), GUARD) for v in ks.outputs]
        call += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.uint32), GUARD) for dt, n in ks.workspace]
        calls.append(call)
        wants.append([env[v] for v in ks.outputs])
    res = CpuExecutor().run(ks, calls, guard=GUARD)
    pairs, tickets = [], []
    n_in = len(ks.inputs)
    for call, want in zip(res, wants):
        for j, v in enumerate(ks.outputs):
            got = torch.from_numpy(payload(call[n_in + j], GUARD, np.float32, tuple(p.values[v].shape)).copy())
            pairs.append((got, want[j]))
        if ks.workspace:
            tickets.append(payload(call[-1], GUARD, np.uint32, (ks.workspace[-1][1],)).copy())
    return ks, pairs, tickets


SMALL = {"block_m": 64, "block_n": 64, "warps_m": 2, "warps_n": 2}


@pytest.mark.parametrize("red", ["sum", "max", "mean", "logsumexp"])
@pytest.mark.parametrize("shape,bias", [((70, 150, 44), True), ((70, 150, 44), False), ((33, 20, 13), True)],
                         ids=["3-ntiles-bias", "3-ntiles-nobias", "1-ntile-bias"])
def test_each_reduction_matches_torch_on_ragged_shapes(red, shape, bias):
    p = program(*shape, [red], bias=bias)
    ks, pairs, tickets = emulate(p, SMALL)
    assert ks.kind == "gemm" and len(ks.outputs) == 1      # the [M, N] output is never written
    assert p.values[ks.outputs[0]].shape == (shape[0],)
    n_tiles = -(-shape[1] // 64)
    assert ks.grid[0] == n_tiles and bool(ks.workspace) == (n_tiles > 1)
    if n_tiles > 1:
        assert "atomicAdd(&counters[tile_m], 1u) == kNTiles - 1" in ks.source
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for t in tickets:       # the last CTA of each row tile reset its ticket: a replay needs no memset
        assert not t.any()


def test_several_reductions_a_kept_output_and_ops_over_the_rows():
    """sum, max, logsumexp and var of one gelu, keepdim, gelu's output also returned, the sum scaled
    by a per-row input; 128 x 128 tiles of 8 warps (4 along N), a thin k slice."""
    p = program(150, 300, 40, ["sum", "max", "logsumexp", "var"], keep_full=True, keepdim=True, post=True)
    ks, pairs, tickets = emulate(p, {"block_m": 128, "block_n": 128, "warps_m": 2, "warps_n": 4, "block_k": 16,
                                     "stages": 4}, draws=2)
    shapes = [p.values[v].shape for v in ks.outputs]
    assert (150, 300) in shapes and shapes.count((150, 1)) == 4
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert tickets and all(not t.any() for t in tickets)


def test_matmul_over_a_batched_input():
    """matmul of [2, 37, 29] by [29, 90]: rows are the 74 (batch, row) pairs."""
    p = program(37, 90, 29, ["logsumexp", "mean"], op="matmul", lead=(2,))
    ks, pairs, _ = emulate(p, SMALL, draws=2)
    assert [p.values[v].shape for v in ks.outputs] == [(2, 37), (2, 37)]
    for got, want in pairs:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _softmax_after(M=64, N=96, K=32):
    p = Program("gemm_softmax_written_out")
    x = p.add_input("x", (M, K))
    y = p.add_node("linear", [x.id, p.add_parameter("w", shape=(N, K)).id]).outputs[0]
    m = p.add_node("max", [y], {"dim": [-1], "keepdim": True}).outputs[0]
    d = p.add_node("sub", [y, m]).outputs[0]
    p.mark_output(p.add_node("exp", [d]).outputs[0])
    return p


def test_a_second_pass_and_a_column_reduction_are_refused_with_the_reason():
    p = _softmax_after()
    why = gemm_supported(p, list(p.nodes))
    assert why and "reads a row result and the GEMM's elements together" in why
    q = Program("gemm_cols")
    x = q.add_input("x", (64, 32))
    y = q.add_node("linear", [x.id, q.add_parameter("w", shape=(48, 32)).id]).outputs[0]
    q.mark_output(q.add_node("sum", [y], {"dim": [0]}).outputs[0])
    why = gemm_supported(q, list(q.nodes))
    assert why and "reduces dims [0]" in why and "last dim" in why
    with pytest.raises(CodegenError, match="last dim"):
        generate_kernel(q, list(q.nodes), name="cols", params={"form": FORM})


@pytest.mark.parametrize("params", [{}, SMALL, {"block_k": 16, "stages": 4}])
def test_row_variants_compile_for_sm90_without_warnings_or_spills(params):
    from agent_core.compiler import compile_kernel
    p = program(1000, 520, 300, ["sum", "max", "logsumexp"])
    ks = generate_kernel(p, list(p.nodes), name="gemm_rows", params={"form": FORM, **params})
    assert "mma.sync.aligned.m16n8k8" in ks.source and "fold_maxsumexp" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []


def _roofline(nbytes, flops, gpu=H200, tflops=None):
    return gpu.launch_ms(True) + max(nbytes / gpu.bytes_per_ms, flops / ((tflops or gpu.fp32_tflops) * 1e9))


@pytest.mark.parametrize("keep_full", [False, True], ids=["rows-only", "output-kept"])
def test_planner_offers_the_form_costed_from_the_kernel_it_generates(keep_full):
    from agent_core.planner import plan_program
    p = program(4096, 1024, 1024, ["logsumexp"], keep_full=keep_full)
    plan = plan_program(p)
    (r,) = [r for r in plan.active if any(p.nodes[n].op == "linear" for n in r.nodes)]
    assert r.kind == "matmul_epilogue" and r.schedule["runs"] == "library+kernel"
    assert sorted(p.nodes[n].op for n in r.nodes) == ["gelu", "linear", "logsumexp"]
    assert r.schedule["forms"] == {"library+kernel": None, FORM: None}
    assert f"one tile-GEMM kernel ({FORM})" in r.reason and "rows reduced (logsumexp) in the kernel" in r.reason
    assert ("is not written at all" in r.reason) == (not keep_full)
    # the tuner's alternative of the library form's epilogue kernel is this form
    lib = generate_kernel(p, r.nodes, name="lib", kind=r.kind)
    assert lib.library_nodes and any(a.get("form") == FORM for a in lib.alternatives)
    ks = generate_kernel(p, r.nodes, name="tile", params={"form": FORM, "sm_count": H200.sm_count})
    est = r.schedule["forms_est_ms"]
    # the region costs the faster form; the tile GEMM's FLOPs go at its split TF32 rate
    assert r.est_after_ms == pytest.approx(min(est.values()))
    assert est[FORM] == pytest.approx(_roofline(ks.bytes_moved, ks.flops, tflops=H200.split_tf32_tflops),
                                      abs=1e-6)   # rounded to the ns
    # what it moves: x, w, b once, its outputs once, and the row states the CTAs of a row share
    vals = p.values
    states = sum(n for dt, n in ks.workspace if dt == "float32")
    assert states == ks.grid[0] * 4096 * 2         # (max, sum of exp) per row per N tile
    assert ks.bytes_moved == sum(vals[v].nbytes for v in ks.inputs + ks.outputs) + 2 * 4 * states
    assert ks.flops == 2 * 4096 * 1024 * 1024 + sum(p.node_flops(n) for n in r.nodes if p.nodes[n].op != "linear")
    if not keep_full:
        assert est[FORM] < est["library+kernel"]     # the output's round trip and one launch saved


def test_cli_plans_and_compiles_the_row_reduction_form(tmp_path):
    src = tmp_path / "lse.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "class Model(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(200, 136)\n"
                   "    def forward(self, x):\n        return torch.logsumexp(torch.relu(self.fc(x)), dim=1)\n"
                   "def get_inputs(): return [torch.randn(100, 200)]\ndef get_init_inputs(): return []\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "agent_core.cli", *a], capture_output=True, text=True,
                                    timeout=300)
    r = run("import", str(src), "-o", str(tmp_path / "lse.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("plan", str(tmp_path / "lse.json"))
    assert r.returncode == 0 and f"tile-GEMM kernel ({FORM})" in r.stdout and "rows reduced" in r.stdout, \
        r.stdout + r.stderr
    r = run("optimize", str(tmp_path / "lse.json"), "--cpu", "-o", str(tmp_path / "out"))
    assert r.returncode == 0 and "the tile GEMM form among them" in r.stdout, r.stdout + r.stderr
