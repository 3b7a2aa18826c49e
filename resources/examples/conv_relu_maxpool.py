"""A VGG-style stage: conv, ReLU, 3x3/2 max pool, conv, ReLU, 2x2 average pool, then tanh. Each ReLU is
applied inside the pooling kernel after it, where its windows read the convolution's output."""
import torch
import torch.nn as nn

BATCH = 8
CHANNELS = 16
SIZE = 66


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.pool1 = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.pool2 = nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(torch.relu(self.conv1(x)))
        return torch.tanh(self.pool2(torch.relu(self.conv2(x))))


def get_inputs():
    return [torch.randn(BATCH, 3, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
