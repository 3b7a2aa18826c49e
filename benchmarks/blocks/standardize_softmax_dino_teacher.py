"""A DINO-style teacher target: standardise each prototype's logit over the batch (axis 0), then
sharpen with a temperature softmax over the prototypes (axis 1, the other axis).

DINO: 65536 prototypes, teacher temperature 0.04; 256 teacher views (128 images x 2 global crops)
per GPU. DINO centres with a running mean; here the centre and the scale come from the batch
itself, as batch-standardised heads (Barlow Twins, SwAV-style) do.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
VIEWS, PROTOTYPES = (16, 512) if SMALL else (256, 65536)
TEMPERATURE = 0.04
EPS = 1e-5


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        centred = logits - logits.mean(dim=0, keepdim=True)
        standardised = centred / (logits.std(dim=0, keepdim=True) + EPS)
        return torch.softmax(standardised / TEMPERATURE, dim=-1)


def get_inputs():
    return [torch.randn(VIEWS, PROTOTYPES)]


def get_init_inputs():
    return []
