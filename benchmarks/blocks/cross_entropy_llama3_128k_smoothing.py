"""Supervised fine-tuning loss of LLaMA-3-8B: cross entropy over the 128256-token vocabulary with
label smoothing 0.1; prompt and padding positions (loss mask 0) become -100, the ignore_index.

LLaMA-3: vocabulary 128256; 2048 tokens (one sequence) per micro-batch, the largest vocabulary
row one GPU sees in practice; the first quarter of the sequence is the prompt.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, VOCAB = (32, 640) if SMALL else (2048, 128256)
IGNORE = -100
SMOOTHING = 0.1


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        labels = torch.where(loss_mask == 1, labels, IGNORE)
        return F.cross_entropy(logits, labels, ignore_index=IGNORE, label_smoothing=SMOOTHING)


def get_inputs():
    mask = torch.ones(TOKENS, dtype=torch.long)
    mask[: mask.shape[0] // 4] = 0  # relative to the drawn shape: the importer may draw it smaller
    return [4.0 * torch.randn(TOKENS, VOCAB), torch.randint(0, VOCAB, (TOKENS,)), mask]


def get_init_inputs():
    return []
