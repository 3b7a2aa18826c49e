"""ConvNeXt's classifier head: global average pooling over the last feature map, LayerNorm over the
channels, then the linear classifier.

ConvNeXt-T at 224x224: the last stage is 768 channels at 7x7, LayerNorm eps 1e-6, 1000 ImageNet
classes; batch 256 is an evaluation batch.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CHANNELS, SIDE, CLASSES = (4, 48, 7, 10) if SMALL else (256, 768, 7, 1000)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(CHANNELS, eps=1e-6)
        self.head = nn.Linear(CHANNELS, CLASSES)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = features.mean(dim=(-2, -1))
        return self.head(self.norm(pooled))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIDE, SIDE)]


def get_init_inputs():
    return []
