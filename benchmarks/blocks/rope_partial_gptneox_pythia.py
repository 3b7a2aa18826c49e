"""Partial rotary embedding of GPT-NeoX / Pythia: only the first quarter of each head is rotated
(rotary_pct 0.25); the rest passes through and is concatenated back (slice, neg, cat, cat).

Pythia-6.9B: 32 heads of 128, 32 rotary dimensions, theta 10000; 2 sequences of 2048 tokens.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ, HEAD_DIM = (2, 4, 16, 32) if SMALL else (2, 32, 2048, 128)
ROTARY = HEAD_DIM // 4
THETA = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = THETA ** (-torch.arange(0, ROTARY, 2, dtype=torch.float64) / ROTARY)
        angles = torch.outer(torch.arange(SEQ, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float())
        self.register_buffer("sin", angles.sin().float())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        rot, keep = x[..., :ROTARY], x[..., ROTARY:]
        rot = rot * self.cos + rotate_half(rot) * self.sin
        return torch.cat((rot, keep), dim=-1)

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        return self.rotate(q), self.rotate(k)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
