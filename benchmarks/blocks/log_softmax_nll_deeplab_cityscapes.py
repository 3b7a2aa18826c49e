"""Per-pixel cross entropy written the classic FCN / DeepLab way: log_softmax over the class axis
(dim 1, not last), then nll_loss against the label map.

DeepLabV3 on Cityscapes: 19 classes, 512x1024 crops, batch 2 per GPU; logits upsampled to the label
size before the loss, as the reference training scripts do.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CLASSES, HEIGHT, WIDTH = (2, 19, 8, 16) if SMALL else (2, 19, 512, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor):
        logprobs = F.log_softmax(logits, dim=1)
        return F.nll_loss(logprobs, labels)


def get_inputs():
    return [3.0 * torch.randn(BATCH, CLASSES, HEIGHT, WIDTH), torch.randint(0, CLASSES, (BATCH, HEIGHT, WIDTH))]


def get_init_inputs():
    return []
