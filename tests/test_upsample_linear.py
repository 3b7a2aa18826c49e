"""Linear resampling (F.interpolate(mode="linear" / "bilinear" / "trilinear")) is an op of its own, not
an opaque node: each output element is a weighted sum of the 2^d inputs around its source point
(codegen/pooling.py _linear_window, torch's source index and weights in float32). Checked against
torch: the import, the pooling kernel with an activation (CPU emulator) for align_corners either way,
scale factors that are not whole, shrinking, 1-D and 3-D; and DeepLab's logits upsampled straight
into a softmax over the classes as one row kernel."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from tests.programs import emulated

MODES = {3: "linear", 4: "bilinear", 5: "trilinear"}


class Resample(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return torch.relu(F.interpolate(x, mode=MODES[x.dim()], **self.kw) - 0.1)


CASES = {
    "bilinear_size": ((2, 3, 7, 9), {"size": (13, 17), "align_corners": False}),
    "bilinear_corners": ((2, 3, 7, 9), {"scale_factor": 2.5, "align_corners": True}),
    "bilinear_scales": ((1, 2, 6, 5), {"scale_factor": (1.5, 3.0)}),
    "bilinear_shrink": ((2, 2, 11, 16), {"size": (4, 5)}),
    "linear_1d": ((2, 3, 10), {"scale_factor": 1.7}),
    "trilinear_3d": ((1, 2, 3, 4, 5), {"size": (5, 7, 9), "align_corners": True}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_linear_resampling_imports_as_its_op_and_its_kernel_matches_torch(name):
    shape, kw = CASES[name]
    x = torch.randn(*shape)
    p = import_nn_module(Resample(**kw), [x])
    ops = [nd.op for nd in p.nodes.values()]
    assert "opaque" not in ops and ops[0].startswith("upsample_"), ops
    assert verify_import(p, Resample(**kw), draws=2) < 1e-5
    [region] = plan_program(p).active
    ks = generate_kernel(p, list(region.nodes), name=name)
    assert ks.kind == "pooling"
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, Resample(**kw)(x), rtol=1e-5, atol=1e-5)


class SegHead(nn.Module):
    def forward(self, logits):
        return torch.log_softmax(F.interpolate(logits, size=(24, 20), mode="bilinear", align_corners=False), dim=1)


def test_logits_upsampled_into_a_softmax_over_the_classes_are_one_row_kernel():
    x = torch.randn(2, 19, 6, 5)
    p = import_nn_module(SegHead(), [x])
    [region] = plan_program(p).active
    assert [p.nodes[n].op for n in region.nodes] == ["upsample_bilinear2d", "log_softmax"]
    assert "interpolated from the inputs around it as it is read (upsample_bilinear2d): the resampled map never " \
           "goes to memory" in region.reason
    ks = generate_kernel(p, list(region.nodes), name="seg")
    assert ks.kind == "row_reduction" and "auto upsample_bilinear2d_at" in ks.source
    got, want = emulated(p, ks, [x])
    torch.testing.assert_close(got, SegHead()(x), rtol=1e-5, atol=1e-5)
