"""The entry of a Conformer convolution module: a pointwise (1x1) Conv1d to twice the width, then a
GLU over the channel axis (dim 1), written as chunk and a * sigmoid(b).

Conformer-L (ASR): model width 512; 16 s utterances at a 40 ms frame rate after subsampling
(400 frames); batch 32.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, WIDTH, FRAMES = (2, 32, 40) if SMALL else (32, 512, 400)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.pointwise = nn.Conv1d(WIDTH, 2 * WIDTH, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.pointwise(x).chunk(2, dim=1)
        return value * torch.sigmoid(gate)


def get_inputs():
    return [torch.randn(BATCH, WIDTH, FRAMES)]


def get_init_inputs():
    return []
