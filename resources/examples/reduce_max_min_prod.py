"""Max, min and product reductions over different dimensions of one tensor, returned together."""
import torch
import torch.nn as nn

BATCH = 16
DIM1 = 257
DIM2 = 32


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        hi = torch.max(x, dim=1).values
        lo = torch.amin(x, dim=2)
        # Product of values near 1 stays finite over 32 factors.
        pr = torch.prod(1.0 + 0.1 * x, dim=2)
        return hi, lo, pr


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return []
