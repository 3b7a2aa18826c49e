"""Instance normalization (per sample, per channel) without affine parameters."""
import torch
import torch.nn as nn

BATCH = 8
CHANNELS = 32
HEIGHT = 40
WIDTH = 40


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.inorm = nn.InstanceNorm2d(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inorm(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS]
