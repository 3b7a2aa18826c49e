"""BLOOM's attention probabilities: scale the q.k scores, add the ALiBi bias (a per-head slope
times the key position), mask the future with the dtype's minimum, softmax over the keys.

BLOOM-7b1: 32 heads of 128 (slopes 2^(-8h/32)), sequence 2048; batch 1 (a long prefill).
"""
import math
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ, HEAD_DIM = (1, 4, 16, 32) if SMALL else (1, 32, 2048, 128)


def alibi_slopes(heads: int) -> torch.Tensor:
    """The geometric sequence of the ALiBi paper for a power-of-two head count."""
    start = 2.0 ** (-8.0 / heads)
    return torch.tensor([start ** (h + 1) for h in range(heads)])


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        bias = alibi_slopes(HEADS).view(1, HEADS, 1, 1) * torch.arange(SEQ).view(1, 1, 1, SEQ)
        self.register_buffer("alibi", bias)
        self.register_buffer("future", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))
        self.scale = 1.0 / math.sqrt(HEAD_DIM)

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores * self.scale + self.alibi
        scores = torch.where(self.future, torch.finfo(scores.dtype).min, scores)
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [8.0 * torch.randn(BATCH, HEADS, SEQ, SEQ)]


def get_init_inputs():
    return []
