"""LLaMA's feed-forward block as written in the model: separate gate and up projections of the same
tokens, silu(gate) * up, then the down projection (no biases).

LLaMA-2-7B: hidden 4096, intermediate 11008; 2048 tokens, one full-context prefill.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, HIDDEN, INTERMEDIATE = (32, 64, 172) if SMALL else (2048, 4096, 11008)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return []
