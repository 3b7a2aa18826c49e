"""A 3-D transposed convolution over a small volume (stride 2, no bias)."""
import torch
import torch.nn as nn

BATCH = 2
IN_CHANNELS = 8
OUT_CHANNELS = 4
DEPTH = 5
HEIGHT = 8
WIDTH = 8
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.deconv = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=2,
                                         padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
