"""Nearest resampling by a whole factor (F.interpolate(mode="nearest"), nn.Upsample) imports as views
(unsqueeze, expand, reshape; a strided slice when shrinking), so it fuses into what reads it; other
ratios stay opaque nodes that run through torch. Each import is checked against the module, and the
fused kernel of an upsample, a skip concatenation and an activation against torch (CPU emulator)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from tests.programs import emulated


class Resample(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, x):
        return F.interpolate(x, mode="nearest", **self.kw) * 2.0


@pytest.mark.parametrize("shape, kw", [
    ((2, 3, 5, 7), {"scale_factor": 2}),
    ((2, 3, 5, 7), {"size": (15, 14)}),                   # 3x and 2x
    ((2, 3, 12, 8), {"size": (4, 2)}),                    # every 3rd row, every 4th column
    ((2, 3, 6), {"scale_factor": 4}),
    ((1, 2, 3, 4, 5), {"scale_factor": (2, 1, 3)}),
], ids=["2d_x2", "2d_size", "2d_shrink", "1d_x4", "3d_mixed"])
def test_whole_factor_nearest_resampling_imports_as_views_and_matches(shape, kw):
    x = torch.randn(*shape)
    p = import_nn_module(Resample(**kw), [x])
    ops = {nd.op for nd in p.nodes.values()}
    assert "opaque" not in ops and ops <= {"reshape", "expand", "slice", "mul_scalar"}, ops
    assert verify_import(p, Resample(**kw), draws=2) < 1e-6


def test_other_ratios_stay_opaque_and_still_match():
    x = torch.randn(2, 3, 4, 6)
    p = import_nn_module(Resample(scale_factor=1.5), [x])
    assert [nd.attrs["target"] for nd in p.nodes.values() if nd.op == "opaque"] == ["aten.upsample_nearest2d.vec"]
    assert verify_import(p, Resample(scale_factor=1.5), draws=2) < 1e-6


class UpCat(nn.Module):
    def forward(self, x, skip):
        return F.leaky_relu(torch.cat([nn.Upsample(scale_factor=2)(x), skip], dim=1), 0.1)


def test_an_upsample_fuses_with_the_skip_concatenation_into_one_kernel_that_matches_torch():
    x, skip = torch.randn(2, 4, 5, 6), torch.randn(2, 3, 10, 12)
    p = import_nn_module(UpCat(), [x, skip])
    [region] = plan_program(p).active
    ks = generate_kernel(p, list(region.nodes), name="upcat")
    got, want = emulated(p, ks, [x, skip])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, UpCat()(x, skip))


class BiFPNNode(nn.Module):
    """EfficientDet's weighted fusion of three levels: one upsampled, one upsampled and max-pooled back."""
    def forward(self, p3, p4, p5, w):
        up = F.interpolate(p4, scale_factor=2, mode="nearest")
        down = F.max_pool2d(F.interpolate(p5, scale_factor=4, mode="nearest"), 2)
        return F.silu(w[0] * p3 + w[1] * up + w[2] * down)


def test_views_before_a_pool_make_one_layout_graph_kernel_with_the_rest_that_matches_torch():
    ins = [torch.randn(2, 4, 8, 8), torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4), torch.rand(3)]
    p = import_nn_module(BiFPNNode(), ins)
    regions = plan_program(p).active
    pooled = next(r for r in regions if any(p.nodes[n].op == "max_pool2d" for n in r.nodes))
    ops = [p.nodes[n].op for n in pooled.nodes]
    assert ops.count("expand") == 4 and "silu" in ops, ops       # both upsamples read through their views
    ks = generate_kernel(p, list(pooled.nodes), name="bifpn")
    assert ks.kind == "pooling" and "auto max_pool2d_at" in ks.source      # a layout graph of window lambdas
    got, want = emulated(p, ks, ins)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
