"""T5 encoder attention probabilities: look the relative-position bias up from its bucket embedding,
move heads first, add it to the (unscaled) scores and softmax over the keys.

T5-base: 12 heads, 32 buckets, max distance 128, bidirectional; sequence 512, batch 16. The
bucket of every (query, key) pair is a buffer computed once, as the model caches it.
"""
import math
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ = (2, 3, 24) if SMALL else (16, 12, 512)
BUCKETS, MAX_DISTANCE = 32, 128


def relative_buckets(seq: int) -> torch.Tensor:
    """Half the buckets per direction; within each, exact distances below 8, then log-spaced to 128."""
    distance = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    half = BUCKETS // 2
    exact = half // 2
    bucket = (distance > 0).long() * half
    n = distance.abs()
    far = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(MAX_DISTANCE / exact)
                   * (half - exact)).long()
    return bucket + torch.where(n < exact, n, far.clamp(max=half - 1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Embedding(BUCKETS, HEADS)
        self.register_buffer("buckets", relative_buckets(SEQ))

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        position_bias = self.bias(self.buckets).permute(2, 0, 1).unsqueeze(0)
        return torch.softmax(scores + position_bias, dim=-1)


def get_inputs():
    return [4.0 * torch.randn(BATCH, HEADS, SEQ, SEQ)]


def get_init_inputs():
    return []
