"""Softmax over long rows (4096 columns), the classic reduction-stitching case."""
import torch
import torch.nn as nn

BATCH = 64
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
