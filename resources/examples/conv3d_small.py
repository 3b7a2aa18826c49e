"""A 3-D convolution over a small volume (asymmetric kernel, padding)."""
import torch
import torch.nn as nn

BATCH = 2
IN_CHANNELS = 4
OUT_CHANNELS = 8
DEPTH = 8
HEIGHT = 16
WIDTH = 16


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size=(3, 3, 5), padding=(1, 1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
