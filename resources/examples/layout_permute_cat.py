"""Layout ops: permute, transpose, reshape, slice, expand and cat, with a little arithmetic."""
import torch
import torch.nn as nn

BATCH = 4
CHANNELS = 16
HEIGHT = 12
WIDTH = 20


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        nhwc = x.permute(0, 2, 3, 1)                        # B, H, W, C
        flat = nhwc.reshape(BATCH, HEIGHT * WIDTH, CHANNELS)  # B, HW, C
        left = flat[:, :100, :]                             # slice along HW
        right = flat[:, 100:200:2, :].transpose(1, 2).transpose(1, 2)  # strided slice, round trip
        bias = row.view(1, 1, CHANNELS).expand(BATCH, 150, CHANNELS)
        joined = torch.cat([left, right], dim=1) + bias    # B, 150, C
        return joined.transpose(1, 2).contiguous()         # B, C, 150


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH), torch.randn(CHANNELS)]


def get_init_inputs():
    return []
