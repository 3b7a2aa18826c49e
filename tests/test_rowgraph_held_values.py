"""A row held in registers keeps the values its passes read, computed once from its inputs
(RowGraph.prologue_values): a masked, scaled score or a sum of gathered embeddings is worked out in
one pass and held, not recomputed (and its broadcast mask or gathered rows loaded again) in each
round. Emulated on the CPU against torch; the kernels compile for sm_90 without spills."""
from __future__ import annotations

import re
import textwrap

import pytest
import torch

from agent_core.codegen.cuda import prune_unused
from agent_core.codegen.region_io import region_io
from agent_core.codegen.rowkernel import generate_multi_reduction
from agent_core.reference import random_inputs, run_reference
from tests import planned
from tests.test_codegen_column_tiles import _compiles, _emulate_region, _kernel_regions, needs_gxx

MASKED_SOFTMAX = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, scores, mask):
            bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
            return torch.softmax(scores / 8.0 + bias, dim=-1)

    def get_inputs():
        return [torch.randn(2, 3, 5, 72), (torch.rand(2, 72) > 0.3).long()]

    def get_init_inputs():
        return []
    """

EMBEDDING_NORM = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(50, 96)
            self.positions = nn.Embedding(7, 96)
            self.norm = nn.LayerNorm(96)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1])
            return self.norm(self.words(ids) + self.positions(pos)[None])

    def get_inputs():
        return [torch.randint(0, 50, (3, 7))]

    def get_init_inputs():
        return []
    """

# a column reduction (the channel dim of [N, C, L]) of a value computed from two inputs
SCALED_CHANNEL_SOFTMAX = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x, y):
            return torch.softmax(x * y + 1.0, dim=1)

    def get_inputs():
        return [torch.randn(2, 24, 40), torch.randn(2, 24, 40)]

    def get_init_inputs():
        return []
    """


@needs_gxx
@pytest.mark.parametrize("name,src,held", [("masked_softmax", MASKED_SOFTMAX, "add"),
                                           ("embedding_norm", EMBEDDING_NORM, "add"),
                                           ("scaled_channel_softmax", SCALED_CHANNEL_SOFTMAX, "add")])
def test_a_value_computed_from_the_inputs_is_held_once_and_matches_torch(tmp_path, name, src, held):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(src))
    _, p = planned.plan(path, small=False)
    (region,) = [r for r in _kernel_regions(p) if any(p.nodes[n].op in ("softmax", "layer_norm") for n in r.nodes)]
    ks = generate_multi_reduction(p, region_io(p, region.nodes), f"held_{name}")
    ks.source = prune_unused(ks.source)        # as codegen.generate_kernel hands it on
    for seed in (0, 1):
        env = run_reference(p, random_inputs(p, seed=seed), keep=True)
        _, outs = _emulate_region(p, region, env, ks=ks)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], atol=1e-5, rtol=1e-5)
    body = ks.source.split("__global__")[1]
    arrays = re.findall(r"float (\w+_held)\[kItems \* kVec\];", body)
    assert len(arrays) == 1 and arrays[0].startswith(held), arrays      # one held value, not the inputs
    # written once, in the pass before the rounds; every later pass reads it
    assert body.count(f"{arrays[0]}[k * kVec + e] = ") + body.count(f"{arrays[0]}[k] = ") == 1
    assert body.count(f"= {arrays[0]}[") >= 2
    assert "loaded once and kept in registers" not in body
    _compiles(ks)
