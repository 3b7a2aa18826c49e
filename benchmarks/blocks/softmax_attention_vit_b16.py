"""ViT-B/16 attention probabilities: scale the raw q.k scores, softmax over the keys (last axis).

ViT-B/16 at 224x224: 196 patches + 1 class token = 197 tokens, 12 heads; batch 64 is one
fine-tuning micro-batch. Rows of 197 are not a multiple of 32, as in every ViT.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, TOKENS, HEAD_DIM = (2, 3, 17, 64) if SMALL else (64, 12, 197, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = HEAD_DIM ** -0.5

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return (scores * self.scale).softmax(dim=-1)


def get_inputs():
    return [4.0 * torch.randn(BATCH, HEADS, TOKENS, TOKENS)]


def get_init_inputs():
    return []
