"""Inclusive prefix sum along rows (a scan), as in KernelBench's cumsum problems."""
import torch
import torch.nn as nn

BATCH = 64
DIM = 1000


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [1]
