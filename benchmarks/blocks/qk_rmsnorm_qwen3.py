"""Qwen3's QK-norm: RMSNorm over each head's 128 dimensions of the projected queries and keys (eps
1e-6, one learned scale per dimension), then heads moved in front of the sequence for attention.

Qwen3-8B: 32 query heads and 8 key/value heads of 128; 2 sequences of 2048 tokens.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = (2, 16, 4, 2, 32) if SMALL else (2, 2048, 32, 8, 128)
EPS = 1e-6


class HeadRMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_norm = HeadRMSNorm(HEAD_DIM)
        self.k_norm = HeadRMSNorm(HEAD_DIM)

    def forward(self, q_proj: torch.Tensor, k_proj: torch.Tensor):
        q = self.q_norm(q_proj.view(BATCH, SEQ, Q_HEADS, HEAD_DIM)).transpose(1, 2)
        k = self.k_norm(k_proj.view(BATCH, SEQ, KV_HEADS, HEAD_DIM)).transpose(1, 2)
        return q, k


def get_inputs():
    return [torch.randn(BATCH, SEQ, Q_HEADS * HEAD_DIM), torch.randn(BATCH, SEQ, KV_HEADS * HEAD_DIM)]


def get_init_inputs():
    return []
