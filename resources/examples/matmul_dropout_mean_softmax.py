"""Linear, dropout (identity in eval), mean over features, softmax over the size-1 axis."""
import torch
import torch.nn as nn

BATCH = 128
IN_FEATURES = 100
OUT_FEATURES = 50
DROPOUT_P = 0.2


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, dropout_p: float):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.matmul(x)
        x = self.dropout(x)
        x = torch.mean(x, dim=1, keepdim=True)
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, DROPOUT_P]
