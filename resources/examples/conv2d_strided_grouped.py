"""A 2-D convolution with stride, padding, dilation and groups, and no bias."""
import torch
import torch.nn as nn

BATCH = 4
IN_CHANNELS = 16
OUT_CHANNELS = 32
HEIGHT = 33
WIDTH = 47
KERNEL_SIZE = 3
GROUPS = 4


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=2,
                              dilation=2, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, GROUPS]
