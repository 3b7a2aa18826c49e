"""Sum over the middle dimension, keeping it as size 1."""
import torch
import torch.nn as nn

BATCH = 16
DIM1 = 1024
DIM2 = 65


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [1]
