"""Adaptive max pooling to 4x4 and adaptive 1-D average pooling to 10 bins (uneven windows)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
CHANNELS = 16
HEIGHT = 30
WIDTH = 30
LENGTH = 257


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, image: torch.Tensor, signal: torch.Tensor):
        return F.adaptive_max_pool2d(image, (4, 4)), F.adaptive_avg_pool1d(signal, 10)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH), torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs():
    return []
