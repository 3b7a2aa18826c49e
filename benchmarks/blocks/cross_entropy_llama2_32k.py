"""Next-token cross entropy of LLaMA-2 training over its 32000-token vocabulary, padding ignored:
labels at padded positions (attention mask 0) become -100, the ignore_index, as Hugging Face
training loops mask them.

LLaMA-2: vocabulary 32000; 4096 tokens (2 sequences of 2048) per micro-batch, the last 1/16 of
each sequence padding.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, VOCAB = (2, 16, 320) if SMALL else (2, 2048, 32000)
IGNORE = -100


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        labels = torch.where(attention_mask == 1, labels, IGNORE)
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=IGNORE)


def get_inputs():
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[:, -(mask.shape[1] // 16):] = 0  # relative to the drawn shape: the importer may draw it smaller
    return [4.0 * torch.randn(BATCH, SEQ, VOCAB), torch.randint(0, VOCAB, (BATCH, SEQ)), mask]


def get_init_inputs():
    return []
