"""Per-pixel class probabilities of a segmentation head: softmax over the class axis (dim 1, not last).

SegFormer / UPerNet on ADE20K: 150 classes, logits at 1/4 of a 512x512 crop (128x128);
batch 8 is one training micro-batch per GPU. The reduced axis has stride 128*128.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CLASSES, HEIGHT, WIDTH = (2, 15, 8, 8) if SMALL else (8, 150, 128, 128)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits, dim=1)


def get_inputs():
    return [3.0 * torch.randn(BATCH, CLASSES, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
