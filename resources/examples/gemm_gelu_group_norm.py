"""GEMM, GELU, then group norm over the features (KernelBench level-2 style chain)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 128
IN_FEATURES = 512
OUT_FEATURES = 1024
NUM_GROUPS = 8


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, num_groups: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group_norm(F.gelu(self.gemm(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, NUM_GROUPS]
