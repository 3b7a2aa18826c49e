"""The end of a ShuffleNetV2 unit: concatenate the pass-through half with the branch output, then
channel shuffle with 2 groups (view, transpose, contiguous, view).

ShuffleNetV2 1.0x, stage 2 at 224x224: 116 channels (two halves of 58) at 28x28; batch 128.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HALF, SIDE = (2, 6, 8) if SMALL else (128, 58, 28)
GROUPS = 2


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, passthrough: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        x = torch.cat((passthrough, branch), dim=1)
        b, c, h, w = x.shape
        x = x.view(b, GROUPS, c // GROUPS, h, w).transpose(1, 2).contiguous()
        return x.view(b, c, h, w)


def get_inputs():
    shape = (BATCH, HALF, SIDE, SIDE)
    return [torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
