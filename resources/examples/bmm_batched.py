"""Batched matrix multiplication: one independent GEMM per batch entry."""
import torch
import torch.nn as nn

BATCH = 8
M = 64
K = 96
N = 80


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
