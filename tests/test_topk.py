"""torch.topk (the k largest, k <= 8, rows of at most 1024: a mixture-of-experts router, a beam's
candidates) imports as k rounds of max and argmax, each pick masked out of the next by its index, so a
router's softmax, its top-k and the picks' values and indices are one row kernel. Emulated on the CPU,
the kernel gives torch's values and indices, NaN first; equal values are distinct picks (torch leaves
their order unspecified; here the smaller index first), -inf rows included. Longer rows, larger k and
the k smallest stay opaque, with the reason."""
import pytest
import torch
import torch.nn as nn

from agent_core.importers import import_nn_module, verify_import
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx


class TopK(nn.Module):
    def __init__(self, k, dim=-1):
        super().__init__()
        self.k, self.dim = k, dim

    def forward(self, x):
        probs = torch.softmax(x, self.dim)
        w, i = torch.topk(probs, self.k, dim=self.dim)
        return w / w.sum(self.dim, keepdim=True), i


class RawTopK(nn.Module):
    def forward(self, x):
        return torch.topk(x, 4, dim=-1)


def _pick_regions(p):
    """The regions holding the argmaxes (one for a short row: the softmax and every pick)."""
    return [r for r in plan_program(p).active if any(p.nodes[n].op == "argmax" for n in r.nodes)]


@needs_gxx
@pytest.mark.parametrize("k,shape,dim", [(1, (16, 8), -1), (2, (32, 8), -1), (4, (6, 64), -1),
                                         (8, (4, 1000), -1), (2, (3, 16, 5), 1)])
def test_a_router_softmax_and_its_top_k_are_one_row_kernel_that_matches_torch(k, shape, dim):
    x = torch.randn(*shape)
    m = TopK(k, dim)
    p = import_nn_module(m, [x])
    ops = [nd.op for nd in p.nodes.values()]
    assert "opaque" not in ops and ops.count("argmax") == k
    assert verify_import(p, m, draws=2) < 1e-6
    regions = _pick_regions(p)
    if k <= 4:      # 8 picks over rows of 1000: the planner may cut the rounds into two kernels
        [r] = regions
        assert {p.nodes[n].op for n in r.nodes} >= {"softmax", "argmax", "max"}
    for seed in range(2):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
        env = run_reference(p, [x], keep=True)
        for r in regions:
            _, outs = _emulate_region(p, r, env)
            for v, got in outs.items():
                assert torch.equal(got, env[v]) if got.dtype == torch.int64 else \
                    torch.allclose(got, env[v], rtol=1e-5, atol=1e-6), p.values[v].name
        w, i = m(x)
        torch.testing.assert_close(env[p.outputs[0]], w, rtol=1e-5, atol=1e-6)
        assert torch.equal(env[p.outputs[1]], i)       # the reference of the library ops: torch's picks


@needs_gxx
def test_nan_comes_first_equal_values_are_distinct_picks_and_minus_inf_rows_too():
    x = torch.randn(5, 12)
    x[0, [3, 9]] = float("nan")                       # NaN above every number, as torch
    x[1] = 2.0                                        # all equal: 4 distinct indices
    x[2] = float("-inf")
    x[2, 7] = 1.0                                     # one finite value, then -inf picks
    x[3] = float("-inf")                              # all -inf
    p = import_nn_module(RawTopK(), [x])
    assert "opaque" not in {nd.op for nd in p.nodes.values()}
    env = run_reference(p, [x], keep=True)
    for r in plan_program(p).active:      # every kernel in plan order, each fed what the last wrote
        _, outs = _emulate_region(p, r, env)
        env.update(outs)
    got_v, got_i = (env[v] for v in p.outputs)
    want_v, want_i = torch.topk(x, 4, dim=-1)
    torch.testing.assert_close(got_v, want_v, equal_nan=True)
    for row in range(5):
        assert len(set(got_i[row].tolist())) == 4                         # never the same element twice
        torch.testing.assert_close(x[row, got_i[row]], got_v[row], equal_nan=True)
    assert got_i[0, :2].tolist() == [3, 9] and got_i[1].tolist() == [0, 1, 2, 3]
    assert got_i[2, 0] == 7 and torch.equal(got_i[4], want_i[4])


@pytest.mark.parametrize("k,cols,largest", [(9, 16, True), (2, 2048, True), (2, 16, False)])
def test_larger_k_longer_rows_and_the_k_smallest_stay_opaque_with_the_reason(k, cols, largest):
    class M(nn.Module):
        def forward(self, x):
            return torch.topk(x, k, dim=-1, largest=largest).values * 2
    p = import_nn_module(M(), [torch.randn(4, cols)])
    [node] = [nd for nd in p.nodes.values() if nd.op == "opaque"]
    assert node.attrs["target"] == "aten.topk.default"
    assert any("topk" in w and ("k smallest" in w or "k <= 8" in w) for w in p.metadata["import_warnings"])
