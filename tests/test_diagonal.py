"""torch.diagonal of any two dims with any offset is a view (views.View.diagonal: the two strides
summed, a new last dim), not an opaque node: imported as the `diagonal` op and read through its view
by whatever kernel consumes it, checked against torch in the CPU emulator (a diagonal into a softmax,
a negative offset of the last two dims of a 4-D tensor); InfoNCE's logsumexp - diagonal plans into the
GEMM's row epilogue."""
import pytest
import torch
import torch.nn as nn

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from tests.programs import emulated


class Diag(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.softmax(torch.diagonal(x, **self.kw) * 2.0, dim=-1)


@pytest.mark.parametrize("shape, kw", [
    ((3, 6, 6), {"dim1": 1, "dim2": 2}),
    ((2, 5, 4, 7), {"offset": -2, "dim1": -1, "dim2": -3}),
    ((9, 5), {"offset": 1}),
], ids=["batched", "negative_offset_4d", "matrix"])
def test_a_diagonal_is_a_view_its_reader_loads_through(shape, kw):
    x = torch.randn(*shape)
    p = import_nn_module(Diag(**kw), [x])
    assert [nd.op for nd in p.nodes.values()] == ["diagonal", "mul_scalar", "softmax"]
    assert verify_import(p, Diag(**kw), draws=2) < 1e-6
    [region] = plan_program(p).active
    ks = generate_kernel(p, list(region.nodes), name="diag")
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, Diag(**kw)(x), rtol=1e-5, atol=1e-6)


class InfoNCE(nn.Module):
    def forward(self, a, b):
        s = a @ b.t() / 0.07
        return (torch.logsumexp(s, dim=1) - torch.diagonal(s)).mean()


def test_infonce_reads_the_diagonal_in_the_gemms_row_epilogue():
    p = import_nn_module(InfoNCE(), [torch.randn(12, 24), torch.randn(12, 24)])
    ops = {nd.op for nd in p.nodes.values()}
    assert "opaque" not in ops and "diagonal" in ops
    region = next(r for r in plan_program(p).active if any(p.nodes[n].op == "diagonal" for n in r.nodes))
    assert {"matmul", "logsumexp", "diagonal", "mean"} <= {p.nodes[n].op for n in region.nodes}
    generate_kernel(p, list(region.nodes), name="infonce", kind=region.kind)

