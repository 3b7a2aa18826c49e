"""The norm-and-activation in front of every SDXL U-Net ResNet convolution: GroupNorm(32) then SiLU.

SDXL at 1024x1024: 128x128 latents, 320 channels in the first down block, 32 groups, eps 1e-5;
batch 2 (the conditional and unconditional halves of classifier-free guidance).
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CHANNELS, HEIGHT, WIDTH = (2, 64, 8, 8) if SMALL else (2, 320, 128, 128)
GROUPS = 32


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(GROUPS, CHANNELS, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(CHANNELS))
            self.norm.bias.add_(0.1 * torch.randn(CHANNELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(x))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
