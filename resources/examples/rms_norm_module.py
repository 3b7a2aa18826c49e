"""RMS normalization through nn.RMSNorm (the library's rms_norm op), over rows of 1000 features."""
import torch
import torch.nn as nn

BATCH = 16
SEQ = 32
HIDDEN = 1000
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=eps)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(hidden) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, EPS]
