"""Causal multi-head attention through F.scaled_dot_product_attention on given q, k, v."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2
HEADS = 4
SEQ = 128
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
