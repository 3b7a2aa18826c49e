"""Average pooling in one dimension (with padding) and in three dimensions."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
CHANNELS = 8
LENGTH = 1000
DEPTH = 8
HEIGHT = 12
WIDTH = 12


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, signal: torch.Tensor, volume: torch.Tensor):
        a = F.avg_pool1d(signal, kernel_size=3, stride=2, padding=1)
        b = F.avg_pool3d(volume, kernel_size=2, stride=2)
        return a, b


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, LENGTH), torch.randn(BATCH, CHANNELS, DEPTH, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
