"""Next-token cross entropy of LLaMA-2 pre-training over its 32000-token vocabulary, padding ignored.

LLaMA-2: vocabulary 32000; 4096 tokens (2 sequences of 2048) per micro-batch. The last 128
positions of each sequence are padding; fairseq-style, the pad id is the ignore_index (here
token 0, LLaMA's <unk>, which real text never targets).
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, VOCAB, PADDED = (2, 16, 320, 4) if SMALL else (2, 2048, 32000, 128)
PAD_ID = 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=PAD_ID)


def get_inputs():
    labels = torch.randint(1, VOCAB, (BATCH, SEQ))
    labels[:, SEQ - PADDED:] = PAD_ID
    return [4.0 * torch.randn(BATCH, SEQ, VOCAB), labels]


def get_init_inputs():
    return []
