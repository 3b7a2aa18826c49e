"""EfficientNet-B0's squeeze-and-excitation: global average pool, a 1x1 convolution down, SiLU, a
1x1 convolution up, sigmoid, and the feature map scaled per channel.

EfficientNet-B0 at 224x224, the MBConv6 of stage 3: 240 expanded channels at 28x28, squeezed
to 10 (a quarter of the block's 40 input channels); batch 128.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CHANNELS, SQUEEZED, SIDE = (2, 24, 4, 8) if SMALL else (128, 240, 10, 28)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.reduce = nn.Conv2d(CHANNELS, SQUEEZED, kernel_size=1)
        self.expand = nn.Conv2d(SQUEEZED, CHANNELS, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3), keepdim=True)
        s = torch.sigmoid(self.expand(F.silu(self.reduce(s))))
        return x * s


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIDE, SIDE)]


def get_init_inputs():
    return []
