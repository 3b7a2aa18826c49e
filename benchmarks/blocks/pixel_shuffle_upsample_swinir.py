"""SwinIR-light's "pixelshuffledirect" tail: the last convolution's 3 * 4 * 4 channels go through
PixelShuffle(4) straight to RGB at four times the resolution, then the dataset mean is added back.

SwinIR lightweight x4 upscaling 480x270 frames to 1920x1080 (the 48-channel map is given); batch 4
frames; the DIV2K RGB mean (0.4488, 0.4371, 0.4040), image range 1.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEIGHT, WIDTH = (1, 6, 10) if SMALL else (4, 270, 480)
SCALE = 4
RGB_MEAN = (0.4488, 0.4371, 0.4040)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("rgb_mean", torch.tensor(RGB_MEAN).view(1, 3, 1, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.pixel_shuffle(features, SCALE) + self.rgb_mean


def get_inputs():
    return [torch.randn(BATCH, 3 * SCALE * SCALE, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
