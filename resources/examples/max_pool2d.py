"""2-D max pooling with a 3x3 window, stride 2 and padding 1 (a ResNet stem pool)."""
import torch
import torch.nn as nn

BATCH = 8
CHANNELS = 32
HEIGHT = 65
WIDTH = 65


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [3, 2, 1]
