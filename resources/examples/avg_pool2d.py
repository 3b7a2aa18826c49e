"""2-D average pooling with a 2x2 window and stride 2 over an odd-sized feature map."""
import torch
import torch.nn as nn

BATCH = 8
CHANNELS = 32
HEIGHT = 63
WIDTH = 64


class Model(nn.Module):
    def __init__(self, kernel_size: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [2]
