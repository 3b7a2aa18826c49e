"""The middle of a Stable Diffusion 1.5 ResnetBlock2D: project the time embedding (SiLU, linear), add
it per channel to the feature map, then GroupNorm(32) and SiLU before the second convolution.

SD 1.5 at 512x512: 64x64 latents, the second down block runs 640 channels at 32x32, time
embedding width 1280; batch 16 is a fine-tuning micro-batch.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, CHANNELS, SIDE, TEMB = (2, 64, 8, 128) if SMALL else (16, 640, 32, 1280)
GROUPS = 32


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.time_proj = nn.Linear(TEMB, CHANNELS)
        self.norm = nn.GroupNorm(GROUPS, CHANNELS, eps=1e-5)

    def forward(self, h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        return F.silu(self.norm(h))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIDE, SIDE), torch.randn(BATCH, TEMB)]


def get_init_inputs():
    return []
