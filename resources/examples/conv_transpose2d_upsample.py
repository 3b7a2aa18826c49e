"""A 2-D transposed convolution (stride 2, padding 1, output padding 1, groups 2)."""
import torch
import torch.nn as nn

BATCH = 4
IN_CHANNELS = 16
OUT_CHANNELS = 8
HEIGHT = 17
WIDTH = 24
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2,
                                         padding=1, output_padding=1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
