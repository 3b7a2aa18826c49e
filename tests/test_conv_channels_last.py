"""Convolutions in channels-last memory (runtime/split_tf32.py's "channels_last" layout, issues 16/17):
every form matches the reference in it, a chain of convolutions and the torch ops between them stays
channels-last (converted once at its start), and the agent keeps the layout only where it measures
faster, recording it in the bench record."""
import textwrap

import pytest
import torch

import agent_core.agent.quick_timing as quick_timing
import agent_core.runtime.split_tf32 as split_mod
from agent_core.agent import EventEmitter
from agent_core.agent.precision import arrives_channels_last, leaves_contiguous, library_forms, variants
from agent_core.agent.precision_share import choose_shared_precision
from agent_core.commands import bench
from agent_core.importers.source import import_file
from agent_core.profile import timing
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.reference import parameter_tensors, random_inputs, run_reference

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
MODELS = {
    # conv -> norm -> activation -> depthwise -> transposed: one channels-last chain
    "conv2d_chain": ('''
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = nn.Conv2d(3, 8, 3, padding=1)
                self.bn = nn.BatchNorm2d(8)
                self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
                self.t = nn.ConvTranspose2d(8, 5, 3, stride=2, output_padding=1)
            def forward(self, x):
                return self.t(self.dw(torch.relu(self.bn(self.c1(x)))))
        def get_inputs():
            return [torch.randn(2, 3, 10, 13)]
        ''', [2, 4]),
    "conv3d_pool": ('''
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = nn.Conv3d(3, 6, 3, padding=1, bias=False)
                self.c2 = nn.Conv3d(6, 4, (1, 3, 3), stride=(1, 2, 1), groups=2)
            def forward(self, x):
                y = F.max_pool3d(F.gelu(self.c1(x)), 2)
                return self.c2(y * 0.5)
        def get_inputs():
            return [torch.randn(2, 3, 6, 9, 8)]
        ''', [2]),
    # compute-bound (about 45 FLOP per byte): every split form is on offer
    "conv2d_wide": ('''
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.c1 = nn.Conv2d(32, 32, 3, padding=1)
                self.c2 = nn.Conv2d(32, 32, 3, padding=1)
            def forward(self, x):
                return self.c2(torch.relu(self.c1(x)))
        def get_inputs():
            return [torch.randn(2, 32, 12, 12)]
        ''', [2]),
    "conv_transpose3d": ('''
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.t = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, groups=2)
                self.c = nn.Conv3d(6, 3, 1)
            def forward(self, x):
                return self.c(torch.sigmoid(self.t(x))) + 1.0
        def get_inputs():
            return [torch.randn(2, 4, 3, 5, 4)]
        ''', [2]),
}


def _program(tmp_path, name):
    src, _ = MODELS[name]
    f = tmp_path / f"{name}.py"
    f.write_text(HEADER + textwrap.dedent(src) + "\ndef get_init_inputs():\n    return []\n")
    return import_file(str(f))


def _convs(p):
    return [n for n in p.topo_order() if p.nodes[n].opdef.category == "convolution"]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("form", ["fp32", "fp32-timed", "3xtf32", "3xtf32-cat"])
def test_every_form_in_channels_last_matches_the_reference(tmp_path, name, form):
    p = _program(tmp_path, name)
    convs = _convs(p)
    p.metadata["library_layout"] = {n: "channels_last" for n in convs}
    p.metadata["library_precision"] = {n: form for n in convs if form != "fp32" and (
        form != "3xtf32-cat" or split_mod.can_concatenate(p, n))}
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    res = exe.verify(draws=4)
    assert res.ok, res.reason


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_chain_stays_channels_last_and_converts_once(tmp_path, name, monkeypatch):
    """The first convolution converts its contiguous input; every later one in the chain gets its input
    already channels-last through the torch ops between (norm, activation, pool, scale), and its output
    stays so."""
    p = _program(tmp_path, name)
    convs = _convs(p)
    p.metadata["library_layout"] = {n: "channels_last" for n in convs}
    seen = []
    real = split_mod.to_channels_last

    def spy(t):
        seen.append(split_mod.is_channels_last(t))
        return real(t)
    monkeypatch.setattr(split_mod, "to_channels_last", spy)
    params = parameter_tensors(p)
    drawn = random_inputs(p, 0)
    env = dict(params)
    env.update({v: drawn[p.values[v].name] for v in p.inputs})
    outs = {}
    for nid in p.topo_order():
        seen.clear()
        split_mod.run_library_node(p, nid, env)
        if nid in convs:
            outs[nid] = env[p.nodes[nid].outputs[0]]
            # the activation (the first conversion asked for) arrives converted in all but the first
            assert seen[0] is (nid != convs[0]), (p.nodes[nid].name, seen)
    assert all(split_mod.is_channels_last(t) for t in outs.values())
    want = run_reference(p, drawn)
    got = env[p.outputs[0]]
    assert torch.allclose(got, want[p.values[p.outputs[0]].name], rtol=1e-4, atol=1e-4)
    # the chooser sees the same chain: each later conv's input arrives channels-last, the last's
    # output (the program's) goes back to contiguous for the caller
    layouts = p.metadata["library_layout"]
    assert [arrives_channels_last(p, n, layouts, set()) for n in convs] == [False] + [True] * (len(convs) - 1)
    assert leaves_contiguous(p, convs[-1], set())
    assert not any(leaves_contiguous(p, n, set()) for n in convs[:-1])


def _fake_timer(monkeypatch, cl_ms: float, other_ms: float):
    """The precision step's timer: the call takes cl_ms when its convolution ran on channels-last
    operands, other_ms otherwise (what cuDNN's layouts would make of it), for every form alike."""
    import agent_core.agent.precision as precision
    ran = {}
    real = precision.run_in_layout

    def spy(p, nid, env, run, layout):   # the convolution's operands as it runs: channels-last or not
        ran["cl"] = layout == "channels_last"
        return real(p, nid, env, run, layout)
    monkeypatch.setattr(precision, "run_in_layout", spy)

    def time_candidate(fn, *, trials, best_ms=None, **kw):
        ran.clear()
        fn()
        return timing.summarize([cl_ms if ran.get("cl") else other_ms] * 3), False
    monkeypatch.setattr(quick_timing, "time_candidate", time_candidate)


def _choose(p):
    params = parameter_tensors(p)
    gen = torch.Generator().manual_seed(0)

    def tensors_for(vids):
        return [params[v] if v in params else torch.randn(p.values[v].shape, generator=gen) for v in vids]
    import io
    buf = io.StringIO()
    return choose_shared_precision(p, tensors_for, EventEmitter(buf), trials=3)


@pytest.mark.parametrize("cl_faster", [True, False])
def test_the_layout_is_chosen_by_measurement_and_recorded(tmp_path, monkeypatch, cl_faster):
    p = _program(tmp_path, "conv2d_chain")
    convs = _convs(p)
    _fake_timer(monkeypatch, cl_ms=0.5 if cl_faster else 1.0, other_ms=1.0 if cl_faster else 0.5)
    _choose(p)
    want = "channels_last" if cl_faster else "as input"
    assert {n: e["layout"] for n, e in library_forms(p).items()} == {n: want for n in convs}
    assert p.metadata["library_layout"] == ({n: "channels_last" for n in convs} if cl_faster else {})

    class Result:
        program, profile, outcomes, status, gpu, writer = p, {}, [], "done", False, None
    rec = bench.record_from_result("chain.py", Result, 1.0)
    assert {e["layout"] for e in rec["library_forms"].values()} == {want}


def test_only_the_fastest_forms_channels_last_variant_is_timed(tmp_path, monkeypatch):
    """Each try in another layout is a cuDNN algorithm search: every form is timed in the input's
    layout, then the fastest once more channels-last, and that variant is kept when it is faster."""
    import agent_core.agent.precision as precision
    p = _program(tmp_path, "conv2d_wide")
    real, running = precision.variants, {}

    def tagged(*a, **k):      # which node and variant each timed call runs
        def tag(key, run):
            def go(prog, nid, env):
                running.update(node=nid, key=key)
                return run(prog, nid, env)
            return go
        return {key: tag(key, run) for key, run in real(*a, **k).items()}
    monkeypatch.setattr(precision, "variants", tagged)
    speed = {"fp32": 1.0, "fp32-timed": 0.9, "3xtf32": 0.8, "3xtf32-cat": 0.6}
    timed: dict[str, list[str]] = {}

    def time_candidate(fn, *, trials, best_ms=None, **kw):
        fn()
        timed.setdefault(running["node"], []).append(running["key"])
        form, layout = precision.split_variant(running["key"])
        return timing.summarize([speed[form] * (0.8 if layout else 1.0)] * 3), False
    monkeypatch.setattr(quick_timing, "time_candidate", time_candidate)
    _choose(p)
    assert set(timed) == {_convs(p)[0]}            # the second, the same call, shares its choice
    for nid, keys in timed.items():
        plain = [k for k in variants(p, nid) if not k.endswith("+channels_last")]
        fastest = min(plain, key=speed.get)
        assert keys == plain + [fastest + "+channels_last"], (p.nodes[nid].name, keys)
        assert len(plain) == 4 and fastest == "3xtf32-cat"
    assert precision.library_precision(p) == {n: "3xtf32-cat" for n in _convs(p)}
    assert p.metadata["library_layout"] == {n: "channels_last" for n in _convs(p)}


def test_a_layout_within_noise_is_not_taken(tmp_path, monkeypatch):
    """Channels-last 3% faster is inside MIN_GAIN: the input's own layout stays."""
    p = _program(tmp_path, "conv3d_pool")
    _fake_timer(monkeypatch, cl_ms=0.97, other_ms=1.0)
    _choose(p)
    assert p.metadata["library_layout"] == {}


def test_only_batched_2d_and_3d_convolutions_get_the_variant(tmp_path):
    p = _program(tmp_path, "conv2d_chain")
    c1 = _convs(p)[0]
    assert {"fp32", "fp32+channels_last", "fp32-timed+channels_last"} <= set(variants(p, c1))
    from agent_core.ir import Program
    q = Program("conv1d")
    x = q.add_input("x", [2, 3, 16]).id
    w = q.add_parameter("w", shape=[4, 3, 3]).id
    y = q.add_node("conv1d", [x, w]).outputs[0]
    q.mark_output(y)
    assert not any(k.endswith("+channels_last") for k in variants(q, q.producer(y).id))
