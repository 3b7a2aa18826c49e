"""Layer normalization over the last two dimensions, with an elementwise affine transform."""
import torch
import torch.nn as nn

BATCH = 16
SEQ = 64
HIDDEN = 384


class Model(nn.Module):
    def __init__(self, seq: int, hidden: int):
        super().__init__()
        self.ln = nn.LayerNorm((seq, hidden), eps=1e-5)
        with torch.no_grad():
            self.ln.weight.copy_(torch.rand(seq, hidden) + 0.5)
            self.ln.bias.copy_(torch.randn(seq, hidden) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return [SEQ, HIDDEN]
