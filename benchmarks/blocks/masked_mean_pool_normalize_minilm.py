"""Sentence-transformers pooling: the attention-masked mean of the token embeddings, then L2
normalisation (F.normalize), the embedding all-MiniLM-L6-v2 returns.

all-MiniLM-L6-v2: width 384, max sequence 256; batch 256 sentences is an encoding batch.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, WIDTH = (4, 16, 48) if SMALL else (256, 256, 384)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
        summed = (token_embeddings * mask).sum(dim=1)
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(summed / counts, p=2, dim=1)


def get_inputs():
    return [torch.randn(BATCH, SEQ, WIDTH), torch.randint(0, 2, (BATCH, SEQ))]


def get_init_inputs():
    return []
