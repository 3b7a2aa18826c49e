"""CBAM's spatial attention on a ResNet-50 feature map: the mean and the max over channels of the
same tensor (two reductions sharing one input), concatenated, a 7x7 convolution, a sigmoid, and
the input scaled by the map.

ResNet-50 + CBAM, stage 1 at 224x224: 256 channels at 56x56; batch 32.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CHANNELS, SIDE = (2, 16, 12) if SMALL else (32, 256, 56)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel_size=7, padding=3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        avg = x.mean(dim=1, keepdim=True)
        peak = x.max(dim=1, keepdim=True).values
        attention = torch.sigmoid(self.conv(torch.cat((avg, peak), dim=1)))
        return x * attention


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIDE, SIDE)]


def get_init_inputs():
    return []
