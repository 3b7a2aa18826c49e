"""A calibration observer over LLaMA-7B activations: the per-channel mean, max and min over all
tokens of one tensor (three reductions sharing one input, over the non-last axis), as
SmoothQuant/AWQ-style quantisation calibration gathers them.

LLaMA-2-7B: hidden 4096; one calibration batch of 4096 tokens (2 sequences of 2048).
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, HIDDEN = (64, 256) if SMALL else (4096, 4096)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, activations: torch.Tensor):
        return activations.mean(dim=0), activations.amax(dim=0), activations.amin(dim=0)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
