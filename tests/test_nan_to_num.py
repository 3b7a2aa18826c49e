"""torch.nan_to_num is a pointwise op, not an opaque one: imported with torch's defaults for the input's
dtype written out (NaN -> 0, +inf -> the largest finite value, -inf -> the lowest), fused like any
pointwise op, and its kernel replaces exactly what torch replaces (CPU emulator)."""
import torch
import torch.nn as nn

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from tests.programs import emulated


class Clean(nn.Module):
    def forward(self, x, n):
        return torch.nan_to_num(x) * 2.0, torch.nan_to_num(x, nan=1.5, posinf=9.0).exp(), torch.nan_to_num(n) + 1


def _special(shape=(6, 10)):
    x = torch.randn(*shape)
    x[0, 1], x[2, 3], x[4, 5], x[5, 9] = float("nan"), float("inf"), float("-inf"), float("nan")
    return x


def test_nan_to_num_imports_as_a_pointwise_op_with_torchs_defaults():
    x, n = _special(), torch.randint(-5, 5, (6, 10))
    p = import_nn_module(Clean(), [x, n])
    ops = [nd.op for nd in p.nodes.values()]
    assert "opaque" not in ops and ops.count("nan_to_num") == 2, ops    # an int tensor passes through
    attrs = [nd.attrs for nd in p.nodes.values() if nd.op == "nan_to_num"]
    big = torch.finfo(torch.float32).max
    assert attrs == [{"nan": 0.0, "posinf": big, "neginf": -big}, {"nan": 1.5, "posinf": 9.0, "neginf": -big}]
    got = run_reference(p, [x, n])
    for g, want in zip([got[p.values[v].name] for v in p.outputs], Clean()(x, n)):
        torch.testing.assert_close(g, want, equal_nan=True)


class Scaled(nn.Module):
    def forward(self, x):
        return torch.tanh(torch.nan_to_num(x, nan=1.5, posinf=9.0) * 0.5)


def test_the_fused_kernel_replaces_nan_and_infinities_as_torch_does():
    x = _special()
    p = import_nn_module(Scaled(), [x])
    [region] = plan_program(p).active
    assert [p.nodes[n].op for n in region.nodes] == ["nan_to_num", "mul_scalar", "tanh"]   # one kernel
    ks = generate_kernel(p, list(region.nodes), name="clean")
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, Scaled()(x))
