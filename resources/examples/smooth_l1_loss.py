"""Smooth L1 (Huber-like) loss with the default beta of 1, mean reduction."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 128
DIM = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(predictions, targets)


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
