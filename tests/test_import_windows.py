"""The aten ops behind shifted windows, patch cuts, position-bias tables and causal masks import as
library ops (no opaque torch call) and the program matches the module: F.pad (constant, reflect),
torch.roll, Tensor.unfold with step == size, table[index] through an index buffer, masked_fill and
~mask. KernelBench's Swin, ViT, Mamba2 and GPT problems use them (tests/test_kernelbench_level3_plan.py)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.importers import import_nn_module, verify_import


class Windows(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("index", torch.randint(0, 7, (4, 4)))
        self.table = nn.Parameter(torch.randn(7, 3))
        self.register_buffer("mask", torch.tril(torch.ones(6, 8, dtype=torch.bool)))

    def forward(self, x):
        bias = self.table[self.index.view(-1)].view(4, 4, -1).permute(2, 0, 1)
        shifted = torch.roll(F.pad(x, (0, 1, 1, 0)), shifts=(-1, 2), dims=(1, 2))
        patches = x.unfold(2, 2, 2).unfold(1, 3, 3)          # 8 = 4 windows of 2; 6 = 2 of 3
        masked = x.masked_fill(~self.mask, float("-inf")).softmax(-1)
        return shifted, bias, patches, F.pad(x, (1, 1), mode="reflect"), masked


def test_window_and_mask_ops_import_as_library_ops_that_match_the_module():
    module = Windows().eval()
    p = import_nn_module(module, [torch.randn(2, 6, 8)])
    ops = [n.op for n in p.nodes.values()]
    assert "opaque" not in ops and not p.metadata["opaque_ops"], p.metadata["import_warnings"]
    assert {"pad", "roll", "index_select", "where", "logical_not"} <= set(ops)
    assert verify_import(p, module, draws=2) == 0.0
