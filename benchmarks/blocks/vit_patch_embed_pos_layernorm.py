"""ViT-B/16's token assembly: the patch convolution's output flattened to tokens (flatten,
transpose), the class token prepended (expand, cat), the learned position embedding added, then the
first block's pre-norm LayerNorm (eps 1e-6).

ViT-B/16 at 224x224: 14x14 = 196 patches + 1 class token, width 768; batch 128.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, WIDTH, GRID = (2, 48, 4) if SMALL else (128, 768, 14)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, WIDTH))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, GRID * GRID + 1, WIDTH))
        self.norm = nn.LayerNorm(WIDTH, eps=1e-6)

    def forward(self, patches: torch.Tensor):
        tokens = patches.flatten(2).transpose(1, 2)
        tokens = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        tokens = tokens + self.pos_embed
        return tokens, self.norm(tokens)


def get_inputs():
    return [torch.randn(BATCH, WIDTH, GRID, GRID)]


def get_init_inputs():
    return []
