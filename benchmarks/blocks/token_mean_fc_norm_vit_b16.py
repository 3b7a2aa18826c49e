"""A ViT classifier head with average pooling: the mean of the patch tokens (the class token sliced
off), LayerNorm over the width (timm's `fc_norm`, as BEiT, DeiT III and MAE fine-tuning use it), then
the linear classifier.

ViT-B/16 at 224x224: 196 patch tokens + 1 class token, width 768, LayerNorm eps 1e-6, 1000 ImageNet
classes; batch 256 is an evaluation batch.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, TOKENS, WIDTH, CLASSES = (4, 10, 48, 10) if SMALL else (256, 197, 768, 1000)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc_norm = nn.LayerNorm(WIDTH, eps=1e-6)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pooled = tokens[:, 1:].mean(dim=1)
        return self.head(self.fc_norm(pooled))


def get_inputs():
    return [torch.randn(BATCH, TOKENS, WIDTH)]


def get_init_inputs():
    return []
