"""The memory plan of an end-to-end program and its split-TF32 decisions, on the CPU.

The end-to-end program is built for the CPU (no CUDA graph) from a real imported nn.Module. Its
predicted peak is that of one live set (every intermediate released after its last reader), the
split-TF32 calls keep their weights' caches only within the memory budget (eager's peak unless the
program sets one), else split per call, else run in fp32, each a recorded decision; every form still
matches the reference.
"""
import pytest
import torch
import torch.nn as nn

from agent_core.importers import import_nn_module
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.program_runtime.memory_plan import eager_peak_estimate
from agent_core.runtime.split_tf32 import run_split_tf32_cat, split_cat_into, split_into, split_tf32
from agent_core.reference import parameter_tensors


class ResidualMLP(nn.Module):
    """fc1's output stays alive across fc2 (the residual); fc2 and fc3 never live together."""

    def __init__(self, d=64):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = self.fc1(x)
        y = torch.relu(self.fc2(torch.relu(h))) + h
        return self.fc3(torch.tanh(y))


ACT = 32 * 64 * 4          # one activation of ResidualMLP, bytes
WEIGHT = 64 * 64 * 4


def _program(model=None, shape=(32, 64)):
    torch.manual_seed(0)
    return import_nn_module(model or ResidualMLP(), [torch.randn(*shape)])


def _linear_outputs(p):
    return [n.outputs[0] for n in p.nodes.values() if n.op == "linear"]


def test_the_peak_is_one_live_set_and_the_default_budget_is_eagers():
    p = _program()
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    m = exe.memory
    # fc2 runs while h (the residual), relu(h) and fc2's output are alive: three activations at once
    assert m.predicted_peak_bytes == 3 * ACT == eager_peak_estimate(p)
    assert m.budget_bytes == eager_peak_estimate(p) and "eager" in m.budget_source
    assert m.to_dict()["predicted_peak_bytes"] == 3 * ACT
    res = exe.verify(draws=3)
    assert res.ok, res.reason


def test_split_parts_made_in_place_match_split_tf32():
    torch.manual_seed(1)
    for shape in ((7, 33), (2, 3, 5, 5)):
        t = torch.randn(*shape) * 10
        t.view(-1)[0] = float("inf")
        hi, lo = torch.empty_like(t), torch.empty_like(t)
        split_into(t, hi, lo)
        ref_hi, ref_lo = split_tf32(t)
        assert torch.equal(hi, ref_hi) and torch.equal(lo.isnan(), ref_lo.isnan())
        assert torch.equal(lo[~lo.isnan()], ref_lo[~ref_lo.isnan()])
    x = torch.randn(2, 4, 3, 3)
    dst = torch.empty(2, 12, 3, 3)
    split_cat_into(x, dst, 1, lo_at=1)
    h, low = split_tf32(x)
    assert torch.equal(dst, torch.cat([h, low, h], dim=1))
    split_cat_into(x, dst, 1, lo_at=2)
    assert torch.equal(dst, torch.cat([h, h, low], dim=1))
    split_cat_into(x, dst, 1, lo_at=0)
    assert torch.equal(dst, torch.cat([low, h, h], dim=1))
    with pytest.raises(ValueError, match="lo_at"):
        split_cat_into(x, dst, 1, lo_at=3)


def _split_program(budget):
    p = _program()
    lin = [n.id for n in p.nodes.values() if n.op == "linear"]
    p.metadata["library_precision"] = {nid: "3xtf32" for nid in lin}
    if budget is not None:
        p.metadata["memory_budget_bytes"] = budget
    return p, lin


def test_split_weights_are_cached_within_a_roomy_budget():
    roomy, _ = _split_program(1 << 30)
    exe = ProgramExecutable(roomy, {}, graph=False, device="cpu")
    m = exe.memory
    assert {d.weights for d in m.decisions.values()} == {"cached"}
    assert all(d.runs_as == "3xtf32" for d in m.decisions.values())
    # three weights' (hi, lo) caches, and fc2's step: three activations plus its input's two parts
    assert m.cache_bytes == 3 * 2 * WEIGHT
    assert m.predicted_peak_bytes == 3 * ACT + 2 * ACT + 3 * 2 * WEIGHT
    assert exe.verify(draws=3).ok


def test_caches_give_way_to_splitting_per_call_before_any_call_runs_in_fp32():
    # room for one call's parts of its activation and its weight, not for three weights' caches
    per_call, lin = _split_program(100_000)
    exe = ProgramExecutable(per_call, {}, graph=False, device="cpu")
    d = exe.memory.decisions
    assert {x.weights for x in d.values()} == {"split per call"}, {k: x.reason for k, x in d.items()}
    assert {x.runs_as for x in d.values()} == {"3xtf32"}
    assert exe.memory.cache_bytes == 0
    assert exe.memory.predicted_peak_bytes == 3 * ACT + 2 * ACT + 2 * WEIGHT <= 100_000
    assert all("split per call" in x.reason for x in d.values())
    assert exe.verify(draws=3).ok


def test_the_default_budget_runs_split_calls_in_fp32_when_their_parts_do_not_fit():
    # eager's peak is three activations; any split part goes above it: every call runs in fp32, and says why
    tight, lin = _split_program(None)
    exe = ProgramExecutable(tight, {}, graph=False, device="cpu")
    assert {x.runs_as for x in exe.memory.decisions.values()} == {"fp32"}
    assert all("runs in fp32" in x.reason for x in exe.memory.decisions.values())
    assert exe.memory.predicted_peak_bytes == 3 * ACT
    assert exe.verify(draws=3).ok
    assert exe.memory.to_dict()["split_tf32"][lin[0]]["runs_as"] == "fp32"


class ConvChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x))).mean(dim=(2, 3)) @ torch.ones(8, 4)


def test_convolution_split_forms_count_their_parts_and_match_the_reference():
    for form in ("3xtf32", "3xtf32-cat"):
        p = _program(ConvChain(), (2, 3, 12, 12))
        convs = [n.id for n in p.nodes.values() if n.op == "conv2d"]
        p.metadata["library_precision"] = {c: form for c in convs}
        p.metadata["memory_budget_bytes"] = 1 << 30
        exe = ProgramExecutable(p, {}, graph=False, device="cpu")
        for c in convs:
            x = p.values[p.nodes[c].inputs[0]].nbytes
            d = exe.memory.decisions[c]
            assert d.weights == "cached" and d.temp_bytes >= (3 if form == "3xtf32-cat" else 2) * x, d
        res = exe.verify(draws=3)
        assert res.ok, (form, res.reason)
        # without room for the caches: the weights are split per call
        p.metadata["memory_budget_bytes"] = exe.memory.predicted_peak_bytes - exe.memory.cache_bytes
        exe = ProgramExecutable(p, {}, graph=False, device="cpu")
        assert {d.weights for d in exe.memory.decisions.values()} <= {"split per call", "none"}
        assert exe.memory.predicted_peak_bytes <= exe.memory.budget_bytes
        assert exe.verify(draws=3).ok


def test_channels_last_concatenated_split_builds_its_input_in_place_with_the_same_result():
    p = _program(ConvChain(), (2, 3, 12, 12))
    conv = next(n for n in p.nodes.values() if n.op == "conv2d")
    env = dict(parameter_tensors(p, "cpu"))
    env[conv.inputs[0]] = torch.randn(2, 3, 12, 12)
    plain, cl = dict(env), dict(env)
    run_split_tf32_cat(p, conv.id, plain, cache_weights=False)
    run_split_tf32_cat(p, conv.id, cl, cache_weights=False, channels_last=True)
    out = cl[conv.outputs[0]]
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, plain[conv.outputs[0]], rtol=1e-5, atol=1e-5)
    ref = torch.nn.functional.conv2d(env[conv.inputs[0]], env[conv.inputs[1]], env[conv.inputs[2]], padding=1)
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_eager_estimate_counts_activations_not_weights_or_inputs():
    p = _program()
    est = eager_peak_estimate(p)
    act = 32 * 64 * 4
    assert 2 * act <= est <= 4 * act       # fc1's output and one or two more at a time; no weights


def test_a_channels_last_call_counts_its_input_copy_and_its_converted_weight():
    p = _program(ConvChain(), (2, 3, 12, 12))
    convs = [n for n in p.nodes.values() if n.op == "conv2d"]
    plain = ProgramExecutable(p, {}, graph=False, device="cpu").memory
    p.metadata["library_layout"] = {c.id: "channels_last" for c in convs}
    p.metadata["memory_budget_bytes"] = 1 << 30
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    weights = sum(-(-p.values[c.inputs[1]].nbytes // 512) * 512 for c in convs)
    assert exe.memory.cache_bytes == weights          # each weight converted once, kept for the run
    assert exe.memory.predicted_peak_bytes > plain.predicted_peak_bytes + weights   # and an input copy
    assert not exe.memory.weights_per_call
    assert exe.verify(draws=2).ok
    # within eager's peak there is no room to keep them: each call converts its weight
    del p.metadata["memory_budget_bytes"]
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    assert exe.memory.cache_bytes == 0 and exe.memory.weights_per_call == {c.id for c in convs}
    assert exe.memory.to_dict()["weights_per_call"] == sorted(c.id for c in convs)
    assert exe.verify(draws=2).ok


class ConvReluPool(nn.Module):
    def __init__(self, inplace: bool):
        super().__init__()
        self.conv, self.relu, self.pool = nn.Conv2d(3, 64, 3), nn.ReLU(inplace=inplace), nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(self.relu(self.conv(x)))


def test_eagers_in_place_relu_shares_its_inputs_buffer_in_the_estimate():
    x = torch.randn(8, 3, 66, 66)
    conv_out, pooled = 8 * 64 * 64 * 64 * 4, 8 * 64 * 32 * 32 * 4
    apart = import_nn_module(ConvReluPool(inplace=False).eval(), [x])
    assert "eager_in_place" not in apart.metadata
    assert eager_peak_estimate(apart) == 2 * conv_out      # relu writes a second map beside conv's
    shared = import_nn_module(ConvReluPool(inplace=True).eval(), [x])
    relu = [n.id for n in shared.nodes.values() if n.op == "relu"]
    assert shared.metadata["eager_in_place"] == relu
    assert eager_peak_estimate(shared) == conv_out + pooled   # relu_ overwrites conv's map; the pool's beside it


class ConvReluConv(nn.Module):
    """conv -> relu (an epilogue kernel after cuDNN) -> conv: relu's map is written over conv's."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _fused(p):
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.codegen import generate_kernel
    from agent_core.planner import apply_plan, plan_program
    from agent_core.regions import active_regions
    apply_plan(p, plan_program(p))
    return {r.id: (r.nodes, generate_kernel(p, r.nodes, name=r.id, kind=r.kind)) for r in active_regions(p)
            if without_kernel(p, r.nodes) is None}


def test_a_pointwise_epilogue_is_written_over_the_library_output_it_reads_last(monkeypatch):
    import agent_core.program_runtime.executable as executable
    from agent_core.reference import run_node, run_reference
    from agent_core.program_runtime.steps import plan_steps
    p = _program(ConvReluConv(), (2, 3, 16, 16))
    fused = _fused(p)
    (rid, (nodes, ks)), = [(r, f) for r, f in fused.items() if f[1].library_nodes]     # conv + relu epilogue
    conv_out = p.nodes[ks.library_nodes[0]].outputs[0]
    _, plan = plan_steps(p, fused)
    assert plan.written_over == {ks.outputs[0]: conv_out}
    one_map = 2 * 16 * 16 * 16 * 4
    assert plan.predicted_peak_bytes == 2 * one_map        # relu's map and the second conv's output, not three

    class Loaded:                                          # evaluates the kernel's nodes, as the mock GPU tests do
        def __init__(self, ks):
            self.kernel = ks

        def __call__(self, ins, outs):
            env = dict(zip(self.kernel.inputs, ins))
            for nid in self.kernel.node_ids:
                run_node(p, nid, env)
            for o, v in zip(outs, self.kernel.outputs):
                o.copy_(env[v].reshape(o.shape))
    written = {}     # kernel -> whether it wrote its output over its first input
    monkeypatch.setattr(executable, "raw_launch", lambda lk, ins, outs: written.update(
        {lk.kernel.name: [o.data_ptr() for o in outs] == [i.data_ptr() for i in ins[:1]]}) or lk(ins, outs))
    exe = ProgramExecutable(p, {r: (n, k, Loaded(k)) for r, (n, k) in fused.items()}, graph=False, device="cpu")
    x = torch.randn(2, 3, 16, 16)
    got = exe(x)[0]
    assert written[ks.name] is True                         # relu wrote into conv's buffer
    # the second conv, alone and compute-bound, runs as the implicit GEMM: it reads relu's map
    assert [k.kind for r, (n, k) in fused.items() if r != rid] == ["gemm"] and not any(
        w for name, w in written.items() if name != ks.name)
    torch.testing.assert_close(got, run_reference(p, {p.values[p.inputs[0]].name: x})[p.values[p.outputs[0]].name])


def test_the_default_budget_is_eagers_peak_on_the_program_as_imported_not_as_rewritten(tmp_path):
    """conv (with bias) -> relu_ -> pool: the bias rewrite takes the bias out of the convolution into an
    add after it, a second full-size map beside the convolution's that eager's relu_ never holds. The
    agent records eager's estimate on the program it was given, and the rewritten program's memory plan
    takes that as its budget."""
    import io

    from agent_core.agent import EventEmitter, optimize, read_events
    x = torch.randn(8, 3, 66, 66)
    imported = import_nn_module(ConvReluPool(inplace=True).eval(), [x])
    buf = io.StringIO()
    res = optimize(imported, out_dir=tmp_path / "out", device="cpu", emit=EventEmitter(buf))
    rules = [e["rule"] for e in read_events(buf.getvalue().splitlines()) if e["event"] == "rewrite" and e["kept"]]
    assert "bias_into_epilogue" in rules, rules
    conv_out, pooled = 8 * 64 * 64 * 64 * 4, 8 * 64 * 32 * 32 * 4
    assert eager_peak_estimate(imported) == conv_out + pooled
    assert eager_peak_estimate(res.program) > conv_out + pooled           # the add's map beside conv's
    assert res.program.metadata["eager_peak_estimate_bytes"] == conv_out + pooled
    exe = ProgramExecutable(res.program, {}, graph=False, device="cpu")
    assert exe.memory.budget_bytes == conv_out + pooled
    assert exe.memory.budget_source == "eager's peak, estimated from the program before its rewrites"


def test_the_split_form_in_channels_last_splits_its_input_there_without_copying_it(monkeypatch):
    from agent_core.program_runtime.memory_plan import call_temp_bytes, rounded
    from agent_core.runtime import split_tf32 as st
    p = _program(ConvChain(), (2, 3, 12, 12))
    conv = next(n for n in p.nodes.values() if n.op == "conv2d")
    x, w = conv.inputs[0], conv.inputs[1]
    converted = []
    real = st.to_channels_last
    monkeypatch.setattr(st, "to_channels_last", lambda t: converted.append(t.shape) or real(t))
    env = dict(parameter_tensors(p, "cpu"))
    env[x] = torch.randn(p.values[x].shape)
    want = dict(env)
    st.run_library_node(p, conv.id, want, form="fp32")
    got = dict(env)
    p.metadata["library_layout"] = {conv.id: "channels_last"}
    st.run_library_node(p, conv.id, got, form="3xtf32", cache_weights=False)
    out = got[conv.outputs[0]]
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, want[conv.outputs[0]], rtol=1e-4, atol=1e-4)
    assert converted == [tuple(p.values[w].shape)]            # the weight, never the input
    # the model: the fp32 form in channels-last copies the input, the split form does not
    copy = rounded(p.values[x].nbytes)
    assert call_temp_bytes(p, conv.id, "fp32", True) == call_temp_bytes(p, conv.id, "fp32", False) + copy
    assert call_temp_bytes(p, conv.id, "3xtf32", True) == call_temp_bytes(p, conv.id, "3xtf32", False)


def test_a_split_call_the_plan_sets_back_runs_in_its_inputs_layout(monkeypatch):
    """A channels-last split convolution whose parts cannot fit within eager's peak runs in fp32, and
    in its input's own layout, as eager runs it: no channels-last weight cached or converted per call,
    no input copy in the model, and no conversion when it runs (plain fp32 channels-last was never
    measured, and 9_ResNet18's layer-4 convolutions ran so at 1.70x eager's peak)."""
    from agent_core.runtime import split_tf32 as st
    p = _program(ConvChain(), (2, 3, 12, 12))
    convs = [n.id for n in p.nodes.values() if n.op == "conv2d"]
    plain = ProgramExecutable(p, {}, graph=False, device="cpu").memory
    p.metadata["library_precision"] = {c: "3xtf32" for c in convs}
    p.metadata["library_layout"] = {c: "channels_last" for c in convs}
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")        # the budget: eager's peak
    assert {d.runs_as for d in exe.memory.decisions.values()} == {"fp32"}, exe.memory.to_dict()
    assert exe.memory.cache_bytes == 0 and not exe.memory.weights_per_call
    assert exe.memory.predicted_peak_bytes == plain.predicted_peak_bytes     # no copies left in the model
    converted = []
    real = st.to_channels_last
    monkeypatch.setattr(st, "to_channels_last", lambda t: converted.append(t.shape) or real(t))
    res = exe.verify(draws=2)
    assert res.ok, res.reason
    assert converted == []


class WideReduction(nn.Module):
    """394 rows from 2048 to 512 features: few output tiles, a long K, so fp32-splitk applies."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2048, 512)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2.0


def test_split_k_partial_products_count_and_the_plan_runs_it_in_fp32_when_they_do_not_fit():
    from agent_core.runtime.split_k import PARTS_KEY, SPLIT_K
    out = 394 * 512 * 4
    for parts, budget, runs_as in ((8, None, "fp32"), (2, 4 * out, SPLIT_K)):
        p = _program(WideReduction(), (394, 2048))
        lin = next(n.id for n in p.nodes.values() if n.op == "linear")
        p.metadata["library_precision"] = {lin: SPLIT_K}
        if parts != 8:
            p.metadata[PARTS_KEY] = {lin: parts}
        if budget is not None:
            p.metadata["memory_budget_bytes"] = budget
        exe = ProgramExecutable(p, {}, graph=False, device="cpu")
        d = exe.memory.decisions[lin]
        assert d.runs_as == runs_as and f"its {parts} partial products" in d.reason, d.reason
        assert exe.memory.predicted_peak_bytes <= exe.memory.budget_bytes
        assert exe.verify(draws=2).ok


def test_generated_kernels_workspaces_count_for_the_whole_run():
    """A split-K running sum (or row states shared between CTAs) is made once per kernel and held for
    the run: the plan adds it like a cache, once per kernel, and never counts it among the parameters'."""
    from types import SimpleNamespace

    from agent_core.program_runtime.memory_plan import kernel_scratch, plan_memory
    from agent_core.program_runtime.steps import Step
    p = _program()
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    base = plan_memory(p, exe.steps, budget=1 << 30)
    ks = SimpleNamespace(name="k", kind="gemm", workspace=[("float32", 1000), ("int32", 6)], inputs=[], outputs=[])
    steps = exe.steps + [Step("kernel", [], kernel=ks), Step("kernel", [], kernel=ks)]   # one kernel, twice
    assert kernel_scratch(steps) == {("scratch", "k"): 4 * 1006}
    planned = plan_memory(p, steps, budget=1 << 30)
    assert planned.predicted_peak_bytes == base.predicted_peak_bytes + 4 * 1006
    assert planned.cache_bytes == base.cache_bytes
