"""Mixtral's MoE router: the gate projection to 8 experts, softmax, the top-2 experts and their
weights renormalised to sum to 1.

The importer has no top-k, so the top 2 of 8 are written with max / argmax twice (the first
maximum masked out), which gives the same experts and weights as torch.topk whenever no two
probabilities tie. Mixtral-8x7B: hidden 4096, 8 experts; 8192 tokens (2 sequences of 4096).
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, HIDDEN = (64, 128) if SMALL else (8192, 4096)
EXPERTS = 8


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)

    def forward(self, hidden: torch.Tensor):
        probs = torch.softmax(self.gate(hidden), dim=-1)
        first, first_idx = probs.max(dim=-1, keepdim=True)
        rest = torch.where(probs == first, -1.0, probs)
        second, second_idx = rest.max(dim=-1, keepdim=True)
        weights = torch.cat((first, second), dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), torch.cat((first_idx, second_idx), dim=-1)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
