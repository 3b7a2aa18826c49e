"""ConvTranspose2d, add a second input, then x * hardswish(x) (KernelBench level-2 style chain)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
IN_CHANNELS = 16
OUT_CHANNELS = 8
HEIGHT = 16
WIDTH = 16


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, 3, stride=2, padding=1,
                                         output_padding=1)

    def forward(self, x: torch.Tensor, add_input: torch.Tensor) -> torch.Tensor:
        y = self.deconv(x) + add_input
        return y * F.hardswish(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH),
            torch.randn(BATCH, OUT_CHANNELS, 2 * HEIGHT, 2 * WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
