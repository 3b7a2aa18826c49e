"""RetinaNet's classification loss: sigmoid focal loss (alpha 0.25, gamma 2) over every anchor and
class, summed and divided by the number of foreground anchors (counted from the targets).

RetinaNet R50-FPN at 800x1333: about 120k anchors per image over P3-P7, 80 COCO classes;
batch 2 per GPU (16 over 8 GPUs). Targets are one-hot with about 1 anchor in 500 foreground.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, ANCHORS, CLASSES = (2, 256, 8) if SMALL else (2, 120000, 80)
ALPHA, GAMMA = 0.25, 2.0
FOREGROUND_RATE = 1 / 500


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(logits)
        ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        p_t = p * targets + (1 - p) * (1 - targets)
        alpha_t = ALPHA * targets + (1 - ALPHA) * (1 - targets)
        foreground = targets.amax(dim=-1).sum().clamp(min=1.0)
        return (alpha_t * ce * (1 - p_t) ** GAMMA).sum() / foreground


def get_inputs():
    targets = (torch.rand(BATCH, ANCHORS, CLASSES) < FOREGROUND_RATE / CLASSES).float()
    return [torch.randn(BATCH, ANCHORS, CLASSES) - 4.0, targets]


def get_init_inputs():
    return []
