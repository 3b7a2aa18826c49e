"""A chain of pointwise ops: mish, softplus, elu, selu, hardswish, hardsigmoid, softsign, clamp, pow, rsqrt."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
DIM = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.mish(x) + F.softplus(x) - F.elu(x, alpha=0.5)
        b = F.selu(a) * F.hardswish(x) + F.hardsigmoid(x) - F.softsign(x)
        c = torch.clamp(b, min=-2.0, max=3.0)
        d = torch.pow(torch.abs(c) + 1.0, 1.5) * torch.rsqrt(x * x + 1.0)
        return F.hardtanh(d, min_val=-1.0, max_val=4.0) + F.leaky_relu(x, negative_slope=0.01)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
