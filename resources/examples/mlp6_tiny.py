"""A six-layer MLP at batch 16: many tiny ops, where launch overhead dominates the run time."""
import torch
import torch.nn as nn

BATCH = 16
IN_FEATURES = 64
LAYER_SIZES = [128, 128, 96, 96, 64, 32]


class Model(nn.Module):
    def __init__(self, in_features: int, layer_sizes: list):
        super().__init__()
        layers = []
        width = in_features
        for i, size in enumerate(layer_sizes):
            layers.append(nn.Linear(width, size))
            if i < len(layer_sizes) - 1:
                layers.append(nn.ReLU())
            width = size
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, LAYER_SIZES]
