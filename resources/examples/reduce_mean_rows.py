"""Mean over the last dimension of long rows (2048), dropping the reduced axis."""
import torch
import torch.nn as nn

BATCH = 32
ROWS = 16
DIM = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH, ROWS, DIM)]


def get_init_inputs():
    return []
