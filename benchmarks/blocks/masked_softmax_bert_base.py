"""BERT self-attention probabilities with padding: scale the scores by 1/sqrt(64), add the extended
attention mask ((1 - mask) * -10000, broadcast over heads and queries), softmax over the keys.

BERT-base: 12 heads of 64, sequence 512; batch 16 is a phase-2 pre-training micro-batch.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ, HEAD_DIM = (2, 3, 16, 64) if SMALL else (16, 12, 512, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, scores: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        extended = (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * -10000.0
        return torch.softmax(scores / HEAD_DIM ** 0.5 + extended, dim=-1)


def get_inputs():
    return [4.0 * torch.randn(BATCH, HEADS, SEQ, SEQ), torch.randint(0, 2, (BATCH, SEQ))]


def get_init_inputs():
    return []
