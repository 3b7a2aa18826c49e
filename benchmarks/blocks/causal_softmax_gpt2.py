"""GPT-2's causal attention probabilities: scale by 1/sqrt(64), keep the lower triangle of a stored
boolean mask (torch.where against the dtype's minimum), softmax over the keys.

GPT-2 small: 12 heads of 64, context 1024; batch 8 is a training micro-batch.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ, HEAD_DIM = (2, 3, 16, 64) if SMALL else (8, 12, 1024, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        causal = torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)).view(1, 1, SEQ, SEQ)
        self.register_buffer("causal", causal)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores / HEAD_DIM ** 0.5
        scores = torch.where(self.causal, scores, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [4.0 * torch.randn(BATCH, HEADS, SEQ, SEQ)]


def get_init_inputs():
    return []
