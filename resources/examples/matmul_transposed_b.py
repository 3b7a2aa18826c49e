"""Matrix multiplication against a transposed operand: A @ B^T (B stored row-major as N x K)."""
import torch
import torch.nn as nn

M = 128
K = 1000
N = 96


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.T)


def get_inputs():
    return [torch.randn(M, K), torch.randn(N, K)]


def get_init_inputs():
    return []
