"""Sibling fusion can complete what a consumer reads: CBAM's cat of the channel mean and the channel max
of one map (two reductions of x, siblings), a top-k's values (the first max reads x, beside the
argmax's key). After the sibling merges the planner tries producer-consumer merges again around the
merged groups, so the cat joins the reductions' kernel (the row kernel stores it per row) instead of
running as a layout kernel of its own. Emulated on the CPU, the kernel equals the reference."""
import pytest
import torch

from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from tests import planned
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx
from tests.test_topk import RawTopK


@needs_gxx
@pytest.mark.parametrize("params", [None, {"split": 3}], ids=["column", "split-column"])
def test_cbam_mean_max_and_their_cat_are_one_kernel(params):
    plan, p = planned.plan(planned.block("spatial_attention_cbam"))
    kernels = [r for r in p.regions if r.schedule.get("runs") == "kernel"]
    [stats] = [r for r in kernels if any(p.nodes[n].op == "max" for n in r.nodes)]
    assert {p.nodes[n].op for n in stats.nodes} == {"mean", "max", "cat"}
    assert not any(r.nodes == [n] and p.nodes[n].op == "cat" for r in kernels for n in r.nodes)
    assert plan["kernels"] == 3      # the stats with their cat, the 7 x 7 convolution, sigmoid * x
    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(p.values[v].shape, generator=g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    ks, outs = _emulate_region(p, stats, env, params=params)
    if params:
        assert ks.params["schedule"] == "split_column"
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], rtol=1e-5, atol=1e-6)


def test_a_top_k_with_its_values_cat_is_one_kernel():
    p = import_nn_module(RawTopK(), [torch.randn(5, 12)])
    [region] = plan_program(p).active
    assert sum(p.nodes[n].op == "cat" for n in region.nodes) == 2
