"""GEMM (nn.Linear), multiply by a scalar, sigmoid, then a residual add of the GEMM output."""
import torch
import torch.nn as nn

BATCH = 128
IN_FEATURES = 1024
OUT_FEATURES = 512
SCALING_FACTOR = 2.0


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scaling_factor: float):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.gemm(x)
        return torch.sigmoid(y * self.scaling_factor) + y


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALING_FACTOR]
