"""Guarded loads (codegen/rowguard.py): a row input that only one arm of a select reads is loaded only
where that arm is taken, so a causal softmax reads about half its scores and a cross entropy none of
the rows whose label is ignored.

On the CPU: which inputs are guarded (and which are not: read outside the select too, or by the
condition itself), and the kernels (held, streamed, scalar loads, split rows, column tiles) run by
the CPU emulator against torch; NVRTC sm_90 builds (a cluster row); the plan's words through the CLI;
the tuner's plain-load variant. The same values as unguarded: only the traffic differs.
"""
import re
import shutil

import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import cli

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
LOWEST = -3.4028234663852886e38


def causal(shape, reverse=False, bias=False, also_raw=False):
    """softmax(where(tril, scores / 8, lowest)) over [B, H, T, T] with a stored [1, 1, T, T] mask;
    `reverse`: where(triu(1), lowest, ...) as BLOOM writes it; `bias`: plus a per-(head, key) bias
    (ALiBi); `also_raw`: the scores also added to the output (then they are needed everywhere)."""
    p = Program("causal")
    x = p.add_input("scores", shape)
    t = shape[-1]
    keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
    m = p.add_input("mask", (1, 1, t, t), dtype="bool")
    ids = []

    def node(op, ins, attrs=None):
        n = p.add_node(op, ins, attrs or {})
        ids.append(n.id)
        return n.outputs[0]
    s = node("div_scalar", [x.id], {"value": 8.0})
    if bias:
        b = p.add_input("alibi", (1, shape[1], 1, t))
        s = node("add", [s, b.id])
    lowest = p.add_input("lowest", ())
    w = node("where", [m.id, lowest.id, s] if reverse else [m.id, s, lowest.id])
    y = node("softmax", [w], {"dim": -1})
    if also_raw:
        y = node("add", [y, x.id])
    p.mark_output(y)
    mask = ~keep if reverse else keep
    inputs = [4 * torch.randn(shape), mask.view(1, 1, t, t)]
    if bias:
        inputs.append(torch.arange(t).float().view(1, 1, 1, t) * torch.rand(1, shape[1], 1, 1))
    inputs.append(torch.tensor(LOWEST))
    return p, ids, inputs


def padded_keys(shape):
    """BERT-style key padding through masked_fill: scores.masked_fill(pad[:, None, None, :], -1e9),
    then softmax; the pad mask is random, so the skipped loads differ row by row."""
    p = Program("padded")
    x = p.add_input("scores", shape)
    pad = p.add_input("pad", (shape[0], 1, 1, shape[-1]), dtype="bool")
    f = p.add_node("masked_fill", [x.id, pad.id], {"value": -1e9})
    y = p.add_node("softmax", [f.outputs[0]], {"dim": -1})
    p.mark_output(y.outputs[0])
    g = torch.Generator().manual_seed(1)
    return p, [f.id, y.id], [torch.randn(shape, generator=g), torch.rand(pad.shape, generator=g) > 0.6]


def cross_entropy(shape, reduction="mean", weight=False, also_logp=False):
    """log_softmax then nll_loss over [N, C] rows with a third of the labels ignored (-100): those rows
    are never loaded. `also_logp`: the log-probabilities are an output too (every row is then read)."""
    p = Program("ce")
    x = p.add_input("logits", shape)
    t = p.add_input("labels", shape[:1], dtype="int64")
    lsm = p.add_node("log_softmax", [x.id], {"dim": 1})
    ins = [lsm.outputs[0], t.id]
    if weight:
        ins.append(p.add_input("class_weight", shape[1:]).id)
    n = p.add_node("nll_loss", ins, {"reduction": reduction, "ignore_index": -100})
    p.mark_output(n.outputs[0])
    if also_logp:
        p.mark_output(lsm.outputs[0])
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(0, shape[1], shape[:1], generator=g)
    labels[::3] = -100
    inputs = [3 * torch.randn(shape, generator=g), labels] + ([torch.rand(shape[1:], generator=g)] if weight else [])
    return p, [lsm.id, n.id], inputs


CASES = {
    "causal, float4": (lambda: causal((2, 3, 40, 40)), {}),
    "causal, scalar loads": (lambda: causal((2, 3, 37, 37)), {}),
    "causal, streamed": (lambda: causal((1, 2, 24, 24)), {"register_max_cols": 8, "warp_max_cols": 4}),
    "future masked with a bias (ALiBi)": (lambda: causal((1, 4, 32, 32), reverse=True, bias=True), {}),
    "key padding (masked_fill)": (lambda: padded_keys((2, 3, 8, 64)), {}),
    "key padding, split rows held": (lambda: padded_keys((1, 1, 3, 9000)), {"sm_count": 16, "spread_min_bytes": 0}),
    "key padding, split rows streamed": (lambda: padded_keys((1, 1, 3, 9000)),
                                         {"sm_count": 16, "spread_min_bytes": 0, "hold": False}),
}


@needs_gxx
@pytest.mark.parametrize("case", CASES)
def test_guarded_loads_under_cpu_emulation_match_torch(case):
    build, params = CASES[case]
    p, ids, inputs = build()
    ks = generate_kernel(p, ids, name="guarded", params=params or None)
    assert "take_scores" in ks.source, ks.source      # the scores' loads are guarded
    if "register_max_cols" in params or params.get("hold") is False:
        assert not ks.params["cached"], ks.schedule
    if "sm_count" in params:
        assert ks.params["schedule"] == "split_row", ks.schedule
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-5), (got - ref).abs().max()


def emulated(p, ks, inputs, guard=64):
    """The kernel run by the CPU emulator on the program's inputs, with a zeroed workspace where it
    has one (a split row's partials and counters): (its output, the reference's)."""
    import numpy as np

    from agent_core.reference import run_reference
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    env = run_reference(p, list(inputs), keep=True)
    out = p.values[ks.outputs[0]]
    bufs = [guarded(env[v].contiguous().numpy(), guard) for v in ks.inputs]
    bufs.append(guarded(np.zeros(out.shape, np.float32), guard))
    bufs += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.uint32), guard) for dt, n in ks.workspace]
    res = CpuExecutor().run(ks, [bufs], guard=guard, timeout_s=120)
    got = torch.from_numpy(payload(res[0][len(ks.inputs)], guard, np.float32, tuple(out.shape)).copy())
    return got, env[ks.outputs[0]]


def test_an_input_also_read_outside_the_where_is_loaded_everywhere():
    p, ids, inputs = causal((2, 3, 40, 40), also_raw=True)
    ks = generate_kernel(p, ids, name="raw")
    assert "take_" not in ks.source


def test_a_condition_computed_from_the_input_itself_guards_nothing():
    """where(x > 0, x, 0) before a sum: x is its own condition's input."""
    p = Program("relu_sum")
    x = p.add_input("x", (4, 64))
    zero = p.add_input("zero", ())
    gt = p.add_node("gt", [x.id, zero.id])
    w = p.add_node("where", [gt.outputs[0], x.id, zero.id])
    s = p.add_node("sum", [w.outputs[0]], {"dim": [-1], "keepdim": False})
    p.mark_output(s.outputs[0])
    ks = generate_kernel(p, [gt.id, w.id, s.id], name="relu_sum")
    assert "take_" not in ks.source


@pytest.mark.parametrize("case", CASES)
def test_guarded_kernels_compile_for_sm_90(case):
    build, params = CASES[case]
    p, ids, _ = build()
    ks = generate_kernel(p, ids, name="guarded", params=params or None)
    assert ks.params["guarded"] == ["scores"], ks.params       # the form compiled is the guarded one
    compile_kernel(ks, arch="sm_90")


def test_the_plan_says_which_input_is_read_only_where_the_mask_keeps_it(monkeypatch):
    monkeypatch.setenv("STITCHCUDA_BLOCKS_SMALL", "1")
    res = cli("plan", "benchmarks/blocks/causal_softmax_gpt2.py")
    assert res.returncode == 0, res.stderr
    assert "'scores' is read only where the where selects it; masked-out elements are never loaded" in res.stdout
    res = cli("plan", "benchmarks/blocks/masked_softmax_bert_base.py")     # an additive mask: every score is read
    assert res.returncode == 0 and "never loaded" not in res.stdout, res.stdout
    res = cli("plan", "benchmarks/blocks/cross_entropy_llama2_32k.py")
    assert "A row whose result is discarded (an ignored label) never loads 'reshape'." in res.stdout, res.stdout


def test_a_cluster_row_guards_its_loads_and_compiles_for_sm_90():
    """A row shared by a thread-block cluster (the emulator runs no clusters: the GPU test runs one)."""
    p, ids, _ = padded_keys((1, 1, 128, 20000))
    ks = generate_kernel(p, ids, name="cluster", params={"sm_count": 132})
    assert ks.params["schedule"] == "cluster" and "take_scores" in ks.source
    compile_kernel(ks, arch="sm_90")


@needs_gxx
@pytest.mark.parametrize("reduction,weight,params", [("mean", False, {}), ("sum", True, {}), ("none", False, {}),
                                                      ("mean", False, {"register_max_cols": 8, "warp_max_cols": 4})])
def test_rows_with_an_ignored_label_are_not_read(reduction, weight, params):
    p, ids, inputs = cross_entropy((12, 40), reduction, weight)
    ks = generate_kernel(p, ids, name="ce", params=params or None)
    assert ks.params["guarded_rows"] == ["logits"] and ks.params["guarded"] == [], ks.params
    assert "_counts) ? " in ks.source
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got, ref.reshape(got.shape), atol=1e-6, rtol=1e-5), (got, ref)


def test_rows_are_read_when_their_log_probabilities_are_an_output_too():
    p, ids, _ = cross_entropy((12, 40), also_logp=True)
    ks = generate_kernel(p, ids, name="ce")
    assert ks.params["guarded_rows"] == [] and "_counts) ? " not in ks.source


@needs_gxx
def test_label_smoothing_rows_with_an_ignored_label_are_not_read():
    """Label smoothing's term is 0 where the label is ignored (a masked_fill, as torch writes it), so
    those rows are skipped too; a NaN in an ignored row stays out of the loss, as in torch."""
    from tests.test_codegen_class_loss import ce_program
    p, ids = ce_program((12, 40), "mean", smoothing=0.1, label_mask=True)
    ks = generate_kernel(p, ids, name="smooth")
    assert ks.params["guarded_rows"] == ["logits"], ks.params
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 40, generator=g)
    labels = torch.randint(0, 40, (12,), generator=g)
    mask = torch.ones(12, dtype=torch.long)
    mask[::4] = 0
    logits[4, 7] = float("nan")               # an ignored row
    inputs = [logits, labels, mask]
    got, ref = emulated(p, ks, inputs)
    want = torch.nn.functional.cross_entropy(logits, torch.where(mask == 1, labels, -100), label_smoothing=0.1)
    assert torch.isfinite(ref) and torch.allclose(ref, want, atol=1e-6)
    assert torch.allclose(got.reshape(()), want, atol=1e-6, rtol=1e-5), (got, want)


def test_the_tuner_times_the_plain_loads_too():
    """A guarded load waits for its condition: the agent also times the kernel without guards and keeps
    the faster (a cross entropy with no label ignored gains nothing from them)."""
    from agent_core.agent.tune import tune_space
    for p, ids, _ in (causal((2, 3, 40, 40)), cross_entropy((12, 40))):
        ks = generate_kernel(p, ids, name="tuned")
        plain = {"guard_loads": False, "sm_count": 132}
        assert tune_space(ks)[0] == plain, tune_space(ks)
        other = generate_kernel(p, ids, name="tuned", params=plain)
        assert other.params["guarded"] == other.params["guarded_rows"] == [] and "float4{}" not in other.source
    p, ids, _ = causal((2, 3, 40, 40), also_raw=True)      # nothing guarded: no such variant
    assert {"guard_loads": False, "sm_count": 132} not in tune_space(generate_kernel(p, ids, name="raw"))


def segmentation_loss(shape, ignore_index=255):
    """DeepLab's per-pixel loss: log_softmax over the classes (dim 1 of [N, C, H, W], a column per
    pixel), nll_loss with the void label 255 on about a fifth of the pixels."""
    p = Program("seg")
    x = p.add_input("logits", shape)
    t = p.add_input("labels", (shape[0], *shape[2:]), dtype="int64")
    lsm = p.add_node("log_softmax", [x.id], {"dim": 1})
    n = p.add_node("nll_loss", [lsm.outputs[0], t.id], {"reduction": "mean", "ignore_index": ignore_index})
    p.mark_output(n.outputs[0])
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    labels[torch.rand(labels.shape, generator=g) < 0.2] = ignore_index
    return p, [lsm.id, n.id], [torch.randn(shape, generator=g), labels]


@needs_gxx
@pytest.mark.parametrize("params", [{}, {"column_max_items": 1}], ids=["held", "streamed"])
def test_column_rows_with_a_void_label_are_not_read(params):
    p, ids, inputs = segmentation_loss((2, 19, 8, 12))
    ks = generate_kernel(p, ids, name="seg", params=params or None)
    assert ks.params["schedule"] == "column" and ks.params["cached"] == (not params), ks.schedule
    assert ks.params["guarded_rows"] == ["logits"], ks.params
    assert re.search(r"(< kCols && |= )\(\w+_counts\) \? logits\[", ks.source), ks.source
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got.reshape(()), ref, atol=1e-6, rtol=1e-5), (got, ref)


@needs_gxx
@pytest.mark.parametrize("hold", [True, False], ids=["held", "streamed"])
def test_split_rows_with_an_ignored_label_are_not_read(hold):
    p, ids, inputs = cross_entropy((3, 9000), "sum")
    ks = generate_kernel(p, ids, name="ce", params={"sm_count": 16, "spread_min_bytes": 0, "hold": hold})
    assert ks.params["schedule"] == "split_row" and ks.params["guarded_rows"] == ["logits"], ks.schedule
    got, ref = emulated(p, ks, inputs)
    assert torch.allclose(got.reshape(()), ref, atol=1e-5, rtol=1e-5), (got, ref)
