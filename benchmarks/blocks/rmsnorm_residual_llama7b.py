"""LLaMA-7B pre-norm step: add the residual stream, then RMSNorm with a learned scale.

Returns the normalised activations (the next attention/MLP's input) and the new residual stream,
as a decoder layer does between its sub-blocks. LLaMA-2-7B: hidden 4096, eps 1e-5; 4096 tokens
(2 sequences of 2048) is one training micro-batch or one long prefill.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, HIDDEN = (2, 16, 256) if SMALL else (2, 2048, 4096)
EPS = 1e-5


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(HIDDEN))

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor):
        residual = hidden + residual
        variance = residual.pow(2).mean(-1, keepdim=True)
        normed = residual * torch.rsqrt(variance + EPS)
        return self.weight * normed, residual


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return []
