"""Binary pointwise ops with broadcasting: where, maximum, minimum, div, sub, exp/log, sqrt, sigmoid, tanh, silu."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
ROWS = 33
DIM = 257


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        gated = torch.where(x > 0, x, y * 0.1)                     # select
        hi = torch.maximum(gated, col)                              # broadcast over (B, R, D) and (D,)
        lo = torch.minimum(x, y)
        ratio = (hi - lo) / (torch.exp(-torch.abs(y)) + 1.0)
        smooth = torch.log(torch.sqrt(x * x + 1.0)) + torch.sigmoid(y) * torch.tanh(x)
        return ratio * 2.0 + F.silu(smooth) - 0.5


def get_inputs():
    return [torch.randn(BATCH, ROWS, DIM), torch.randn(BATCH, ROWS, DIM), torch.randn(DIM)]


def get_init_inputs():
    return []
