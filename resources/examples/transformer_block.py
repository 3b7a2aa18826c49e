"""A pre-LN transformer encoder block: multi-head self-attention written with matmuls and softmax,
a GELU MLP, and two residual connections.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
SEQ = 128
D_MODEL = 256
N_HEADS = 4
MLP_RATIO = 4


class Model(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).reshape(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                                   # B, H, S, Dh
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, v)                                     # B, H, S, Dh
        return self.proj(out.transpose(1, 2).reshape(b, s, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, D_MODEL)]


def get_init_inputs():
    return [D_MODEL, N_HEADS, MLP_RATIO]
