"""A DINOv2 block boundary: the attention branch's output scaled per channel by LayerScale, added to
the residual stream, then the LayerNorm that opens the MLP branch (eps 1e-6).

DINOv2 ViT-L/14 at 224x224: width 1024, 256 patches + class token = 257 tokens; LayerScale
initialised at 1e-5 and trained (drawn around 0.1 here); batch 64.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, TOKENS, WIDTH = (2, 17, 64) if SMALL else (64, 257, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gamma = nn.Parameter(0.1 * torch.rand(WIDTH))
        self.norm = nn.LayerNorm(WIDTH, eps=1e-6)

    def forward(self, residual: torch.Tensor, attn_out: torch.Tensor):
        residual = residual + self.gamma * attn_out
        return residual, self.norm(residual)


def get_inputs():
    return [torch.randn(BATCH, TOKENS, WIDTH), torch.randn(BATCH, TOKENS, WIDTH)]


def get_init_inputs():
    return []
