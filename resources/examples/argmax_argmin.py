"""Argmax and argmin over rows of length 1000 (int64 results)."""
import torch
import torch.nn as nn

BATCH = 64
DIM = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        return torch.argmax(x, dim=1), torch.argmin(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
