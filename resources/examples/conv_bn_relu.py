"""Conv2d, BatchNorm2d (eval: a folding target), ReLU: the ResNet building block's front half."""
import torch
import torch.nn as nn

BATCH = 8
IN_CHANNELS = 16
OUT_CHANNELS = 32
HEIGHT = 28
WIDTH = 28


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(out_channels) * 0.2)
            self.bn.running_var.copy_(torch.rand(out_channels) + 0.5)
            self.bn.weight.copy_(torch.rand(out_channels) + 0.5)
            self.bn.bias.copy_(torch.randn(out_channels) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
