"""torch.nn.RNN / LSTM / GRU import as library nodes (ops/recurrent.py) with exact output specs: every
variant (layers, bidirectional, batch_first, with and without h0 / c0, projections) imports as one
node with no opaque call, plans, and its program's CPU reference equals the module's forward; the
LSTM metadata that torch <= 2.12's export records (h_n and c_n one dimension too many, pytorch#151200,
which failed KernelBench's 35_LSTM: "output 1 is float32[6, 10, 256] but out_specs says
float32[6, 1, 10, 256]") is repaired; `stitchcuda plan` prints the plan of such a file."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn

from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from agent_core.reference import random_inputs, run_reference

# torch's own note when the module's eager forward runs an LSTM with a projection on the CPU
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")

CLASSES = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


class Returns(nn.Module):
    """The recurrent module, returning (output, h_n[, c_n]) as separate outputs; h0 / c0 given
    as inputs when `with_state`."""

    def __init__(self, net: nn.Module, with_state: bool):
        super().__init__()
        self.net, self.with_state = net, with_state

    def forward(self, x, *state):
        if isinstance(self.net, nn.LSTM):
            out, (h, c) = self.net(x, tuple(state)) if state else self.net(x)
            return out, h, c
        out, h = self.net(x, state[0]) if state else self.net(x)
        return out, h


def _case(kind, layers=1, bidirectional=False, batch_first=False, with_state=False, **kw):
    net = CLASSES[kind](5, 6, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **kw)
    t, b = 4, 3
    x = torch.randn(b, t, 5) if batch_first else torch.randn(t, b, 5)
    dirs = 2 if bidirectional else 1
    out = kw.get("proj_size") or 6
    state = []
    if with_state:
        state = [torch.randn(layers * dirs, b, out)] + ([torch.randn(layers * dirs, b, 6)] if kind == "lstm" else [])
    return Returns(net, with_state).eval(), [x] + state


VARIANTS = [
    ("lstm", dict()),
    ("lstm", dict(layers=2, bidirectional=True, batch_first=True, with_state=True)),
    ("lstm", dict(layers=3, batch_first=True)),
    ("lstm", dict(bidirectional=True, proj_size=4, with_state=True)),
    ("lstm", dict(layers=2, bias=False, with_state=True)),
    ("gru", dict()),
    ("gru", dict(layers=2, bidirectional=True, with_state=True)),
    ("gru", dict(layers=2, batch_first=True, bidirectional=True)),
    ("rnn", dict(layers=2, with_state=True)),
    ("rnn", dict(bidirectional=True, batch_first=True, nonlinearity="relu")),
]


def _check(module, args, kind):
    p = import_nn_module(module, args, name=kind)
    ops = [n.op for n in p.nodes.values()]
    assert ops == [kind], ops              # one library node: no opaque call, no unrolled cell
    with torch.no_grad():
        want = module(*args)
    node = next(iter(p.nodes.values()))
    assert [p.values[v].shape for v in node.outputs] == [tuple(w.shape) for w in want]
    plan = plan_program(p)
    assert [r.nodes for r in plan.active] == [[node.id]]
    inputs = random_inputs(p, seed=3)
    got = run_reference(p, inputs)
    with torch.no_grad():
        ref = module(*[inputs[p.values[v].name] for v in p.inputs])
    assert len(got) == len(ref)
    for g, r in zip(got.values(), ref):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-6)
    return p


@pytest.mark.parametrize("kind, kw", VARIANTS, ids=[f"{k}-{'-'.join(f'{a}={b}' for a, b in kw.items()) or 'plain'}"
                                                    for k, kw in VARIANTS])
def test_recurrent_nets_import_as_one_node_that_matches_the_module(kind, kw):
    module, args = _case(kind, **kw)
    p = _check(module, args, kind)
    node = next(iter(p.nodes.values()))
    assert node.attrs["num_layers"] == kw.get("layers", 1) and node.attrs["batch_first"] == kw.get("batch_first", False)
    assert node.attrs["bidirectional"] == kw.get("bidirectional", False)
    # the weights are the module's parameters, under torch.nn's names, in torch.nn's order
    names = [p.values[v].name for v in node.inputs[1 + (2 if kind == "lstm" else 1):]]
    assert names == [f"net.{n}" for n in module.net._flat_weights_names]


@pytest.fixture
def lstm_export_of_torch_2_12(monkeypatch):
    """torch.export's LSTM decomposition as torch <= 2.12 ran it: each layer's (h, c) kept the time
    step dimension, so the trace records h_n and c_n as [L * D, 1, B, H]. Only tracing runs it: the
    real op (and so the module's forward) is unchanged."""
    import torch._decomp.decompositions as decomp
    one_layer = decomp.one_layer_lstm

    def old(inp, hidden, params, has_biases, reverse=False):
        out, (h, c) = one_layer(inp, hidden, params, has_biases, reverse)
        return out, (h.unsqueeze(0), c.unsqueeze(0))

    monkeypatch.setattr(decomp, "select_one_layer_lstm_function", lambda *a: old)


class LastStep(nn.Module):
    """KernelBench's LSTM pattern, plus readers of h_n and c_n downstream of the LSTM."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(5, 6, num_layers=3, batch_first=True)
        self.fc = nn.Linear(6, 2)

    def forward(self, x, h0, c0):
        out, (h, c) = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :]), h[-1] * 2.0, c.sum(0)


@pytest.mark.parametrize("kernels", ["shape rule", "torch's decomposition"])
def test_the_lstm_state_shapes_old_torch_exports_record_are_repaired(lstm_export_of_torch_2_12, kernels, monkeypatch):
    """The importer traces the LSTM through the library's shape rule; where it could not put that in
    place of torch's decomposition (here: told not to), it repairs the recorded shapes after tracing,
    for the LSTM's results and for what is computed from them (h[-1] * 2, c.sum(0))."""
    if kernels != "shape rule":
        import agent_core.importers.recurrent_meta as recurrent_meta
        monkeypatch.setattr(recurrent_meta, "_KEYS", ())
    module = LastStep().eval()
    args = [torch.randn(3, 4, 5), torch.randn(3, 3, 6), torch.randn(3, 3, 6)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # export's advice on LSTM's flat weights
        ep = torch.export.export(module, tuple(args), strict=False)      # the fixture reproduces the bug
    lstm = next(n for n in ep.graph.nodes if n.op == "call_function" and "lstm" in str(n.target))
    assert [tuple(v.shape) for v in lstm.meta["val"]][1:] == [(3, 1, 3, 6), (3, 1, 3, 6)]
    p = import_nn_module(module, args)
    node = next(n for n in p.nodes.values() if n.op == "lstm")
    assert [p.values[v].shape for v in node.outputs] == [(3, 4, 6), (3, 3, 6), (3, 3, 6)]
    assert "opaque" not in [n.op for n in p.nodes.values()]
    repaired = [w for w in p.metadata["import_warnings"] if "pytorch#151200" in w]
    assert len(repaired) == (0 if kernels == "shape rule" else 1)
    assert [p.values[v].shape for v in p.outputs] == [(3, 2), (3, 6), (3, 6)]
    plan_program(p)
    inputs = random_inputs(p, seed=1)
    got = run_reference(p, inputs)
    with torch.no_grad():
        want = module(*[inputs[p.values[v].name] for v in p.inputs])
    for g, w in zip(got.values(), want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


FILE = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.gru = nn.GRU(8, hidden, num_layers=2, batch_first=True, bidirectional=True)
            self.head = nn.Linear(2 * hidden, 3)

        def forward(self, x, h0):
            out, h = self.gru(x, h0)
            return torch.relu(self.head(out[:, -1, :])), h

    def get_inputs():
        return [torch.randn(4, 7, 8), torch.randn(4, 4, 16)]

    def get_init_inputs():
        return [16]
""")


def test_stitchcuda_plan_prints_the_plan_of_a_recurrent_model(tmp_path):
    path = tmp_path / "gru_model.py"
    path.write_text(FILE)
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "plan", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("r1 ") and line.rstrip().endswith(": gru") for line in lines), r.stdout
    assert "opaque" not in r.stdout
    assert any("linear" in line for line in lines if line.startswith("r"))
    assert any(" regions, " in line for line in lines)


def test_optimize_runs_a_recurrent_net_as_a_library_call_and_generates_around_it(tmp_path):
    path = tmp_path / "gru_model.py"
    path.write_text(FILE)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(path), "--cpu", "--no-tune",
                        "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "(gru) runs through cuDNN via torch" in r.stdout, r.stdout
    assert "not generated" not in r.stdout
    regions = json.loads((out / "program.json").read_text())["regions"]
    agent = [reg["schedule"]["agent"]["status"] for reg in regions]
    assert "library" in agent and "compiled" in agent, agent
