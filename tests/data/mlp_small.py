"""A small MLP (three linear layers, ReLU between) with weights small enough to store inline:
the program behind the studio's recorded event logs."""
import torch
import torch.nn as nn

BATCH = 16
IN_FEATURES = 32
HIDDEN = 32
OUT_FEATURES = 10


class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, OUT_FEATURES]
