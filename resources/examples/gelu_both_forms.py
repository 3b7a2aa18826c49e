"""GELU in its exact (erf) and tanh-approximated forms, plus the tanh form written out by hand."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
DIM = 3000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor):
        exact = F.gelu(x)
        approx = F.gelu(x, approximate="tanh")
        by_hand = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
        return exact, approx, by_hand


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
