"""A 1-D transposed convolution that doubles the signal length (stride 2, output padding 1)."""
import torch
import torch.nn as nn

BATCH = 4
IN_CHANNELS = 32
OUT_CHANNELS = 16
LENGTH = 257
KERNEL_SIZE = 4


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.deconv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=2,
                                         padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
