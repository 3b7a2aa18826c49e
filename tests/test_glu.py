"""torch.nn.functional.glu imports as two slices (views), a sigmoid and a product, not an opaque node,
so it fuses with what is around it (Conformer's convolution module gates its channels with it)."""
import torch
import torch.nn as nn

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from tests.programs import emulated


class Glu(nn.Module):
    def forward(self, x):
        return nn.functional.glu(x, dim=1) + nn.functional.glu(x.transpose(1, 2), dim=-1).transpose(1, 2)


def test_glu_imports_as_two_slices_a_sigmoid_and_a_product_in_one_kernel():
    x = torch.randn(2, 8, 5)
    p = import_nn_module(Glu(), [x])
    ops = [nd.op for nd in p.nodes.values()]
    assert "opaque" not in ops and ops.count("sigmoid") == 2, ops
    assert verify_import(p, Glu(), draws=2) < 1e-6
    [region] = plan_program(p).active
    ks = generate_kernel(p, list(region.nodes), name="glu")
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, Glu()(x), rtol=1e-5, atol=1e-6)
