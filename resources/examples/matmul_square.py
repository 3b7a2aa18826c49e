"""A single matrix multiplication C = A @ B with odd inner and outer sizes."""
import torch
import torch.nn as nn

M = 257
K = 384
N = 300


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
