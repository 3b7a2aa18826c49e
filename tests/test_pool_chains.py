"""Chains of windowed poolings. A max pool of a max pool, both stride 1 and padded to keep the size
(YOLO's SPPF: three 5 x 5 pools in a row), is rewritten exactly as one max pool of the first one's input
over the combined window (5, 9, 13): generated as one kernel, a pool of a pool evaluates the window
before it at every position, 625 reads of each output's 81 inputs. The planner refuses to put a chain of
overlapping windows in one kernel when each input would be read more than 4 times (an average pool of an
average pool); non-overlapping chains (78_Max_Max's pools) and short ones (3 x 3 of 3 x 3) stay fused."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.compiler import compile_kernel
from agent_core.codegen import generate_kernel
from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from agent_core.rewrites import rewrite_program
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


class SPPF(nn.Module):
    def __init__(self):
        super().__init__()
        self.cv1, self.cv2 = nn.Conv2d(16, 8, 1), nn.Conv2d(32, 16, 1)

    def forward(self, x):
        x = F.silu(self.cv1(x))
        y1 = F.max_pool2d(x, 5, 1, 2)
        y2 = F.max_pool2d(y1, 5, 1, 2)
        y3 = F.max_pool2d(y2, 5, 1, 2)
        return F.silu(self.cv2(torch.cat((x, y1, y2, y3), 1)))


class Chains(nn.Module):
    def forward(self, x):
        a = F.avg_pool2d(F.avg_pool2d(torch.relu(x), 5, 1, 2), 5, 1, 2)            # 7.7 reads: split
        b = F.max_pool2d(F.max_pool2d(x, 3, 1, 1), 2, 2)                            # 2.25: one kernel
        c = F.max_pool2d(F.max_pool2d(x, 2, 2), 3, 3, ceil_mode=True)             # no overlap: one kernel
        d = F.max_pool2d(F.max_pool2d(x, 3, 2, 1), 3, 1, 1)                        # stride 2 first: not merged
        return a, b, c, d


@needs_gxx
def test_sppf_pools_read_the_map_once_each_and_match_torch():
    m = SPPF()
    x = torch.randn(2, 16, 20, 20)
    p = import_nn_module(m, [x])
    done = rewrite_program(p, check=True)
    q = done.program
    assert [e["rule"] for e in done.fired].count("merge_max_windows") == 2
    pools = [nd for nd in q.nodes.values() if nd.op == "max_pool2d"]
    assert sorted(nd.attrs["kernel_size"][0] for nd in pools) == [5, 9, 13]
    assert len({nd.inputs[0] for nd in pools}) == 1             # each reads the activation itself
    assert verify_import(q, m, draws=2) < 1e-5
    [r] = [r for r in plan_program(q).active if any(q.nodes[n].op == "max_pool2d" for n in r.nodes)]
    ks = generate_kernel(q, list(r.nodes), name="sppf", kind=r.kind)
    assert compile_kernel(ks, arch="sm_90").spill_stores == 0
    env = run_reference(q, [x], keep=True)
    _, outs = _emulate_region(q, r, env)
    for v, got in outs.items():
        torch.testing.assert_close(got, env[v], rtol=1e-5, atol=1e-6)


def test_only_overlapping_chains_that_reread_too_much_are_split():
    x = torch.randn(2, 4, 18, 18)
    p = rewrite_program(import_nn_module(Chains(), [x])).program
    pools = {nd.id: nd for nd in p.nodes.values() if "pool" in nd.op}
    assert len(pools) == 8             # nothing merged: no chain of two size-keeping max pools
    plan = plan_program(p)
    together = [[n for n in r.nodes if n in pools] for r in plan.active]
    assert sorted(len(t) for t in together if t) == [1, 1, 2, 2, 2]
    assert any("would read each input 7.7 times" in e["message"] for e in plan.log)


class Dilated(nn.Module):
    def forward(self, x):       # a 5 x 5 window of dilated 5 x 5 windows: 625 reads over a 13 x 13 span
        return F.max_pool2d(F.max_pool2d(x, 5, 1, 2), 5, 1, 2, dilation=2)


def test_a_dilated_window_spreads_its_chain_and_stays_fused():
    """The repeat counts the second window's dilation: 625 reads of 13 x 13 inputs is 3.7 a read, under
    the limit (counted undilated, 25 x 25 over 9 x 9 would be 7.7 and split)."""
    x = torch.randn(2, 4, 18, 18)
    p = rewrite_program(import_nn_module(Dilated(), [x])).program
    pools = [nd.id for nd in p.nodes.values() if "pool" in nd.op]
    assert len(pools) == 2
    plan = plan_program(p)
    assert any(set(pools) <= set(r.nodes) for r in plan.active)
    assert not any("would read each input" in e["message"] for e in plan.log)
