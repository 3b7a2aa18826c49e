"""2-D batch normalization in eval mode: running statistics and an affine transform."""
import torch
import torch.nn as nn

BATCH = 8
FEATURES = 64
HEIGHT = 32
WIDTH = 32


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)
        # Non-trivial running statistics and affine parameters, so eval mode is really exercised.
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(num_features) * 0.5)
            self.bn.running_var.copy_(torch.rand(num_features) + 0.5)
            self.bn.weight.copy_(torch.rand(num_features) + 0.5)
            self.bn.bias.copy_(torch.randn(num_features) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def get_inputs():
    return [torch.randn(BATCH, FEATURES, HEIGHT, WIDTH)]


def get_init_inputs():
    return [FEATURES]
