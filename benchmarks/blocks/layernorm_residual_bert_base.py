"""BERT-base sub-layer output: LayerNorm(dense output + bias + input), BertSelfOutput's tail.

The dense projection has run; its output (without bias), the bias and the sub-layer's input arrive
here. BERT-base: hidden 768, eps 1e-12; batch 16 at sequence 512 is a phase-2 pre-training
micro-batch on one GPU.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, HIDDEN = (2, 16, 96) if SMALL else (16, 512, 768)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(0.02 * torch.randn(HIDDEN))
        self.norm = nn.LayerNorm(HIDDEN, eps=1e-12)
        with torch.no_grad():
            self.norm.weight.add_(0.1 * torch.randn(HIDDEN))
            self.norm.bias.add_(0.1 * torch.randn(HIDDEN))

    def forward(self, dense_out: torch.Tensor, sublayer_in: torch.Tensor) -> torch.Tensor:
        return self.norm(dense_out + self.bias + sublayer_in)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return []
