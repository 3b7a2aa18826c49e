"""Softmax over a middle dimension of a 3-D tensor (a strided reduction, not the last axis)."""
import torch
import torch.nn as nn

BATCH = 16
DIM = 257
INNER = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM, INNER)]


def get_init_inputs():
    return []
