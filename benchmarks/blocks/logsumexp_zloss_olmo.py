"""The output-layer z-loss (PaLM; used by OLMo and Chameleon): 1e-4 * mean(logsumexp(logits)^2), which
keeps the softmax normaliser near 1.

OLMo-1B: vocabulary 50304 (50280 padded to a multiple of 128); 4096 tokens (2 sequences of 2048)
per micro-batch.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, VOCAB = (32, 384) if SMALL else (4096, 50304)
Z_LOSS_WEIGHT = 1e-4


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        z = torch.logsumexp(logits, dim=-1)
        return Z_LOSS_WEIGHT * z.square().mean()


def get_inputs():
    return [4.0 * torch.randn(TOKENS, VOCAB)]


def get_init_inputs():
    return []
