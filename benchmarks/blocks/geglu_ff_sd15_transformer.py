"""The GEGLU feed-forward entry of Stable Diffusion's transformer blocks: one linear projection to
twice the inner width, chunk, then hidden * gelu(gate).

SD 1.5's first transformer block at 512x512: 64x64 = 4096 latent tokens, width 320, inner
width 1280 (the projection is 2560 wide); batch 2 for classifier-free guidance.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, TOKENS, WIDTH = (2, 16, 32) if SMALL else (2, 4096, 320)
INNER = 4 * WIDTH


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(WIDTH, 2 * INNER)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return hidden * F.gelu(gate)


def get_inputs():
    return [torch.randn(BATCH, TOKENS, WIDTH)]


def get_init_inputs():
    return []
