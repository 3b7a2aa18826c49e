"""A 1-D convolution over a long signal, with padding and a bias."""
import torch
import torch.nn as nn

BATCH = 4
IN_CHANNELS = 16
OUT_CHANNELS = 32
LENGTH = 1000
KERNEL_SIZE = 5


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
