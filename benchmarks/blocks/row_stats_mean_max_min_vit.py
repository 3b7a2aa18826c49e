"""Per-token statistics of ViT-L activations for dynamic int8 quantisation: the min and max of each
token's row give the asymmetric scale and zero point (ZeroQuant-style per-token quantisation), the
mean is logged beside them: three reductions over the last axis of one tensor.

ViT-L/16 at 224x224: width 1024, 197 tokens; batch 64.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, TOKENS, WIDTH = (2, 17, 128) if SMALL else (64, 197, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        return x.mean(dim=-1), x.max(dim=-1).values, x.min(dim=-1).values


def get_inputs():
    return [torch.randn(BATCH, TOKENS, WIDTH)]


def get_init_inputs():
    return []
