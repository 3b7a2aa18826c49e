"""Conv2d, then an extra per-channel bias, then ReLU (a GEMM/conv epilogue fusion target)."""
import torch
import torch.nn as nn

BATCH = 8
IN_CHANNELS = 3
OUT_CHANNELS = 16
HEIGHT = 32
WIDTH = 32
KERNEL_SIZE = 3
BIAS_SHAPE = (OUT_CHANNELS, 1, 1)


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias_shape: tuple):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + self.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, BIAS_SHAPE]
