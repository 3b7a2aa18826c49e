"""One fully connected layer y = x W^T + b (nn.Linear) with an odd output width."""
import torch
import torch.nn as nn

BATCH = 64
IN_FEATURES = 512
OUT_FEATURES = 1000


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
