"""Group normalization: 64 channels in 8 groups over a 2-D feature map."""
import torch
import torch.nn as nn

BATCH = 8
CHANNELS = 64
GROUPS = 8
HEIGHT = 28
WIDTH = 28


class Model(nn.Module):
    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels)
        with torch.no_grad():
            self.gn.weight.copy_(torch.rand(num_channels) + 0.5)
            self.gn.bias.copy_(torch.randn(num_channels) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [GROUPS, CHANNELS]
