"""Hinge loss mean(clamp(1 - y * f(x), min=0)) with targets of -1 or +1."""
import torch
import torch.nn as nn

BATCH = 256
DIM = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.clamp(1 - predictions * targets, min=0))


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randint(0, 2, (BATCH, 1)).float() * 2 - 1]


def get_init_inputs():
    return []
