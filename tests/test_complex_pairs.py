"""complex64 values imported as float32 pairs (importers/complex_pairs.py): LLaMA's reference rotary
embedding (view_as_complex, a complex product, view_as_real) becomes library ops that generate, where it
was opaque torch calls around complex values; sums, real and scalar factors, views and broadcasts of
complex values too. A complex value that reaches an op without a pair form keeps its view_as_complex
opaque, and the import still matches the module."""

import torch
import torch.nn as nn

from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


def _freqs(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    angles = torch.outer(torch.arange(end), freqs).float()
    return torch.polar(torch.ones_like(angles), angles)


class LlamaRotary(nn.Module):
    """Meta's reference apply_rotary_emb: q and k as complex numbers times the complex frequencies."""
    def __init__(self, seq=16, dim=32):
        super().__init__()
        self.register_buffer("freqs_cis", torch.view_as_real(_freqs(dim, seq)))

    def forward(self, xq, xk):
        fc = torch.view_as_complex(self.freqs_cis)
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        fc = fc.view(1, xq_.shape[1], 1, xq_.shape[-1])
        return torch.view_as_real(xq_ * fc).flatten(3).type_as(xq), torch.view_as_real(xk_ * fc).flatten(3)


class ComplexArithmetic(nn.Module):
    def forward(self, x, y, s):
        z, w = torch.view_as_complex(x), torch.view_as_complex(y)
        return torch.view_as_real(((z + w) * 0.5 - w) * s.unsqueeze(0) * w.unsqueeze(0).expand(2, 3, 5))


class ComplexAbs(nn.Module):
    def forward(self, x):
        return torch.view_as_complex(x).abs() * 2


class ComplexAngle(nn.Module):
    def forward(self, x):
        z = torch.view_as_complex(x)
        return z.angle() * 2 + z.abs()


@needs_gxx
def test_llama_rotary_embedding_imports_as_library_ops_and_its_kernels_match_torch():
    m = LlamaRotary()
    xq, xk = torch.randn(2, 16, 4, 32), torch.randn(2, 16, 4, 32)
    p = import_nn_module(m, [xq, xk])
    ops = [nd.op for nd in p.nodes.values()]
    assert "opaque" not in ops and {"sub", "add", "cat"} <= set(ops)
    assert verify_import(p, m, draws=2) < 1e-5
    regions = plan_program(p).active
    assert len(regions) <= 2          # q's and k's rotations (one kernel each, or one for both)
    env = run_reference(p, [xq, xk], keep=True)
    for r in regions:
        _, outs = _emulate_region(p, r, env)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], rtol=1e-5, atol=1e-6)


def test_sums_real_and_scalar_factors_views_and_broadcasts_of_complex_values():
    m = ComplexArithmetic()
    x, y, s = torch.randn(3, 5, 2), torch.randn(3, 5, 2), torch.randn(3, 5)
    p = import_nn_module(m, [x, y, s])
    assert "opaque" not in {nd.op for nd in p.nodes.values()}
    assert verify_import(p, m, draws=3) < 1e-5
    env = run_reference(p, [x, y, s], keep=True)
    torch.testing.assert_close(env[p.outputs[0]], m(x, y, s), rtol=1e-5, atol=1e-6)


def test_the_magnitude_of_a_complex_value_is_a_hypot_of_its_parts():
    x = torch.randn(4, 6, 2)
    x[0, 0] = torch.tensor([3e30, 4e30])        # hypot, not sqrt(a * a + b * b), as torch
    p = import_nn_module(ComplexAbs(), [x])
    assert "opaque" not in {nd.op for nd in p.nodes.values()} and "hypot" in {nd.op for nd in p.nodes.values()}
    assert verify_import(p, ComplexAbs(), draws=2) < 1e-5


def test_a_complex_value_without_a_pair_form_keeps_its_ops_opaque():
    """angle has no pair form: view_as_complex, angle and abs (of a complex value torch holds) all run
    through torch (before, the library's abs read the complex value and the import differed from the
    module)."""
    p = import_nn_module(ComplexAngle(), [torch.randn(4, 6, 2)])
    targets = [nd.attrs["target"] for nd in p.nodes.values() if nd.op == "opaque"]
    assert sorted(targets) == ["aten.abs.default", "aten.angle.default", "aten.view_as_complex.default"]
    assert verify_import(p, ComplexAngle(), draws=2) < 1e-5
