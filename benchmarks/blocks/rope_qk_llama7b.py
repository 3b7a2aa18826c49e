"""Rotary position embedding on LLaMA-7B queries and keys: q * cos + rotate_half(q) * sin, where
rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]) (slice, neg, cat), the same for k.

LLaMA-2-7B: 32 heads of 128, rope theta 10000; 2 sequences of 2048 tokens. The cos/sin tables
are buffers built once, as the model caches them.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, HEADS, SEQ, HEAD_DIM = (2, 4, 16, 32) if SMALL else (2, 32, 2048, 128)
THETA = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        inv_freq = THETA ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
        angles = torch.outer(torch.arange(SEQ, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float())
        self.register_buffer("sin", angles.sin().float())

    def forward(self, q: torch.Tensor, k: torch.Tensor):
        q_rot = q * self.cos + rotate_half(q) * self.sin
        k_rot = k * self.cos + rotate_half(k) * self.sin
        return q_rot, k_rot


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
