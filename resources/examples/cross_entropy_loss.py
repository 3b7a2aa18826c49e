"""Cross-entropy loss over 1000 classes with int64 class-index targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 256
NUM_CLASSES = 1000


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs():
    return [torch.randn(BATCH, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (BATCH,))]


def get_init_inputs():
    return []
