"""A library call's measured temporaries and workspace (agent.precision.temporaries) decide with the
memory budget which of its forms may be chosen, and what the chosen one adds beyond the memory plan's
model is counted in the plan's predicted peak (issue 17: the cuDNN algorithms picked by timing had
workspaces the plan never saw; 5_AlexNet ran 1.2 GB above its prediction at 3883459).

On the CPU the timings and the measured bytes are given per form; the choice, its reason, the
metadata and the plan are the real ones."""
import io
import json

import torch
import torch.nn as nn

import agent_core.agent.precision as precision
import agent_core.agent.quick_timing as quick_timing
from agent_core.agent import EventEmitter
from agent_core.agent.precision_share import choose_shared_precision
from agent_core.importers import import_nn_module
from agent_core.profile import timing
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.reference import parameter_tensors

MIB = 1 << 20


class TwoLinears(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _program():
    torch.manual_seed(0)
    p = import_nn_module(TwoLinears(), [torch.randn(32, 64)])
    p.metadata["memory_budget_bytes"] = 1 << 40
    return p


def _linears(p):
    return [n for n in p.topo_order() if p.nodes[n].op == "linear"]


MS = {"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.6}     # split TF32 fastest as three calls


def _extra(fp32: int, split: int) -> dict[str, int]:
    """Measured bytes: fp32's, and each split form's."""
    return {"fp32": fp32, "3xtf32": split, "3xtf32-cat": split}


def _fake_gpu(monkeypatch, ms: dict[str, float], extra: dict[str, int]):
    """Each form's time and measured bytes, by the form (variant key) that runs."""
    real, running = precision.variants, {}

    def tagged(*a, **k):
        def tag(key, run):
            def go(prog, nid, env):
                running["key"] = key
                return run(prog, nid, env)
            return go
        return {key: tag(key, run) for key, run in real(*a, **k).items()}
    monkeypatch.setattr(precision, "variants", tagged)

    def time_candidate(fn, *, trials, best_ms=None, **kw):
        fn()
        return timing.summarize([ms[running["key"]]] * 3), False
    monkeypatch.setattr(quick_timing, "time_candidate", time_candidate)

    def temporaries(program, nid, run, env):
        run(program, nid, dict(env))
        return extra[running["key"]]
    monkeypatch.setattr(precision, "temporaries", temporaries)


def _choose(p, room):
    params = parameter_tensors(p)
    gen = torch.Generator().manual_seed(0)

    def tensors_for(vids):
        return [params[v] if v in params else torch.randn(p.values[v].shape, generator=gen) for v in vids]
    log = io.StringIO()
    choose_shared_precision(p, tensors_for, EventEmitter(log), trials=3, room=room)
    return [json.loads(line) for line in log.getvalue().splitlines()]


def test_a_form_whose_measured_workspace_does_not_fit_is_not_chosen(monkeypatch):
    p = _program()
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(2 * MIB, 40 * MIB))
    events = _choose(p, room={n: 16 * MIB for n in _linears(p)})     # 40 MiB where 16 are left: over
    assert precision.library_precision(p) == {}
    first = next(e for e in events if e.get("event") == "precision")
    assert first["chosen"] == "fp32"
    assert "temporaries and workspace" in first["reason"] and "3xtf32 (40.0 MiB)" in first["reason"]
    assert precision.workspace_bytes(p) == {}


def test_a_forms_whole_workspace_must_fit_not_only_its_excess_over_fp32s(monkeypatch):
    """The room models no workspace, so fp32's own is not already counted in it: 17 MiB where 16 are
    left does not fit, though it is only 15 MiB more than fp32's 2 (9_ResNet18's layer-4 convolutions
    ran at 1.77x eager's peak under that comparison)."""
    p = _program()
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(2 * MIB, 17 * MIB))
    _choose(p, room={n: 16 * MIB for n in _linears(p)})
    assert precision.library_precision(p) == {}


def test_a_form_needing_no_more_than_fp32_is_allowed_where_fp32_itself_passes_the_room(monkeypatch):
    """Eager runs the call in plain fp32 with its workspace: a form needing no more than that fits
    wherever eager does, even past the modeled room."""
    p = _program()
    fc1, fc2 = _linears(p)
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(20 * MIB, 19 * MIB))
    _choose(p, room={n: 16 * MIB for n in (fc1, fc2)})
    assert precision.library_precision(p) == {fc1: "3xtf32", fc2: "3xtf32"}


def test_the_chosen_forms_workspace_beyond_the_model_is_in_the_predicted_peak(monkeypatch):
    from agent_core.program_runtime.memory_plan import call_temp_bytes
    p = _program()
    fc1, fc2 = _linears(p)
    fp32_peak = ProgramExecutable(p, {}, graph=False, device="cpu").memory.predicted_peak_bytes
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(2 * MIB, 40 * MIB))
    _choose(p, room={n: 64 * MIB for n in (fc1, fc2)})
    assert precision.library_precision(p) == {fc1: "3xtf32", fc2: "3xtf32"}
    beyond = 38 * MIB - call_temp_bytes(p, fc1, "3xtf32", False)
    assert precision.workspace_bytes(p) == {fc1: beyond, fc2: beyond}      # fc2 shares fc1's call and measure
    with_ws = ProgramExecutable(p, {}, graph=False, device="cpu").memory.predicted_peak_bytes
    measured = p.metadata.pop("library_workspace_bytes")
    assert with_ws - ProgramExecutable(p, {}, graph=False, device="cpu").memory.predicted_peak_bytes == beyond
    # within a budget without room for it, the plan runs the calls in fp32 and the workspace is gone
    p.metadata.update(library_workspace_bytes=measured, memory_budget_bytes=fp32_peak)
    plan = ProgramExecutable(p, {}, graph=False, device="cpu").memory
    assert {d.runs_as for d in plan.decisions.values()} == {"fp32"}
    assert plan.predicted_peak_bytes == fp32_peak


def test_a_node_without_room_for_the_shared_forms_workspace_is_weighed_alone(monkeypatch):
    p = _program()
    fc1, fc2 = _linears(p)
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(0, 40 * MIB))
    events = _choose(p, room={fc1: 64 * MIB, fc2: 16 * MIB})
    assert precision.library_precision(p) == {fc1: "3xtf32"}
    assert not any(e.get("shared_with") for e in events if e.get("event") == "precision")
    assert set(precision.workspace_bytes(p)) == {fc1}


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(128, 128, 3, padding=1)     # a 576 KiB weight

    def forward(self, x):
        return torch.relu(self.conv(x))


class _Slow(dict):
    """Any form not named: slow, and no bytes beyond its output."""
    def __init__(self, default, **named):
        super().__init__(named)
        self.default = default

    def __missing__(self, key):
        return self.default


def test_a_channels_last_forms_weight_counts_at_its_call_though_measured_cached(monkeypatch):
    """A channels-last call's weight is there at the call, as a cache or a per-call copy: with 1 MiB
    left, 0.75 MiB measured plus the 0.56 MiB weight does not fit, so the faster channels-last form is
    not chosen and the reason says why."""
    from agent_core.agent.precision import CL
    torch.manual_seed(0)
    p = import_nn_module(Conv(), [torch.randn(1, 128, 8, 8)])
    [conv] = [n for n in p.topo_order() if p.nodes[n].op == "conv2d"]
    _fake_gpu(monkeypatch, ms=_Slow(2.0, fp32=1.0, **{"fp32" + CL: 0.5}),
              extra=_Slow(0, fp32=MIB // 4, **{"fp32" + CL: 3 * MIB // 4}))
    events = _choose(p, room={conv: MIB})
    assert not p.metadata.get("library_layout"), p.metadata.get("library_layout")
    reason = next(e for e in events if e.get("event") == "precision")["reason"]
    assert f"fp32{CL} (1.3 MiB)" in reason, reason
    _choose(p, room={conv: 2 * MIB})            # with room for both, it is chosen
    assert p.metadata["library_layout"] == {conv: "channels_last"}


def test_a_call_set_back_to_fp32_for_memory_runs_in_its_inputs_layout():
    """fit_to_memory sets a split call whose parts cannot fit back to fp32, and the channels-last
    layout kept for the split form goes with it: plain fp32 channels-last was never measured, and its
    per-call weight copy is more than eager's call allocates (9_ResNet18's layer-4 convolutions ran
    so at 1.70x eager's peak)."""
    from agent_core.program_runtime.steps import planned_steps
    from agent_core.runtime.split_tf32 import CHANNELS_LAST, library_layout
    torch.manual_seed(0)
    p = import_nn_module(Conv(), [torch.randn(1, 128, 8, 8)])
    [conv] = [n for n in p.topo_order() if p.nodes[n].op == "conv2d"]
    p.metadata.update(library_precision={conv: "3xtf32"}, library_layout={conv: CHANNELS_LAST},
                      memory_budget_bytes=MIB)       # the 0.56 MiB weight's parts cannot fit beside the rest
    log = io.StringIO()
    assert precision.fit_to_memory(p, planned_steps(p, []), EventEmitter(log)) == [conv]
    assert precision.library_precision(p) == {} and library_layout(p) == {}
    [event] = [json.loads(line) for line in log.getvalue().splitlines()]
    assert event["chosen"] == "fp32" and event["layout"] == "as input", event
    assert "in its input's layout" in event["reason"]
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    assert conv not in exe.memory.weights_per_call        # no channels-last weight made per call
    assert exe.verify(draws=2).ok


class TwoWideReductions(nn.Module):
    """The same 2048-to-512 linear call twice on 394 rows: few output tiles, a long K (fp32-splitk)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2048, 512), nn.Linear(2048, 512)

    def forward(self, x):
        return self.fc1(x) + self.fc2(x * 2.0)


def test_split_k_fitted_to_the_room_is_shared_with_its_part_count(monkeypatch):
    """The room at both calls holds two partial products, not the eight that fill the SMs: the timed
    call is cut in two, and the call that takes its form from it is cut in two as well (timed with
    eight there, the plan would have modeled two and the runtime allocated eight)."""
    from agent_core.runtime.split_k import SPLIT_K, parts
    torch.manual_seed(0)
    p = import_nn_module(TwoWideReductions(), [torch.randn(394, 2048)])
    out = 394 * 512 * 4
    fc1, fc2 = _linears(p)
    _fake_gpu(monkeypatch, ms=_Slow(2.0, fp32=1.0, **{SPLIT_K: 0.5}), extra=_Slow(0, **{SPLIT_K: 2 * out}))
    events = _choose(p, room={fc1: 2 * out + 1000, fc2: 2 * out + 1000})
    assert precision.library_precision(p) == {fc1: SPLIT_K, fc2: SPLIT_K}
    assert parts(p, fc1) == parts(p, fc2) == 2
    shared = next(e for e in events if e.get("event") == "precision" and e.get("node") == fc2)
    assert shared["shared_with"] == fc1
    timed = next(e for e in events if e.get("event") == "precision" and e.get("node") == fc1)
    assert "cut into 2 parts" in timed["reason"] and "the SMs take 8" in timed["reason"]


def test_a_call_whose_forms_could_not_be_timed_says_why_for_the_bench_record(monkeypatch):
    """A split form that runs out of GPU memory while timed (other processes' share of it under bench
    --jobs) leaves the call in fp32 with the reason kept, which bench's crowding check reads."""
    p = _program()
    _fake_gpu(monkeypatch, ms=MS, extra=_extra(0, 0))
    real = quick_timing.time_candidate

    def crowded(fn, **kw):
        if kw.get("best_ms") is not None:              # every form after fp32's
            raise RuntimeError("CUDA out of memory. Tried to allocate 96.00 MiB")
        return real(fn, **kw)
    monkeypatch.setattr(quick_timing, "time_candidate", crowded)
    _choose(p, room=None)
    assert precision.library_precision(p) == {}
    errors = p.metadata[precision.ERRORS_KEY]
    assert set(errors) == {_linears(p)[0]}          # timed there; the same call on fc2 shares fp32
    assert all(e.startswith("RuntimeError: CUDA out of memory.") for e in errors.values())
