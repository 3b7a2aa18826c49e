"""Conv3d, softmax over channels, then two max pools (KernelBench level-2 style chain)."""
import torch
import torch.nn as nn

BATCH = 2
IN_CHANNELS = 3
OUT_CHANNELS = 16
DEPTH = 8
HEIGHT = 16
WIDTH = 16
KERNEL_SIZE = 3
POOL_KERNEL_SIZE = 2


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, pool_kernel_size: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=1)
        self.pool1 = nn.MaxPool3d(pool_kernel_size)
        self.pool2 = nn.MaxPool3d(pool_kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.softmax(self.conv(x), dim=1)
        return self.pool2(self.pool1(x))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, POOL_KERNEL_SIZE]
