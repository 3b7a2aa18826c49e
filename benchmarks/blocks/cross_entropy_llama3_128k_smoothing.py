"""Supervised fine-tuning loss of LLaMA-3-8B: cross entropy over the 128256-token vocabulary with
label smoothing 0.1 and the pad token ignored.

LLaMA-3: vocabulary 128256; 2048 tokens (one sequence) per micro-batch, the largest vocabulary
row one GPU sees in practice. Padding uses <|finetune_right_pad_id|> (128004) as ignore_index.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, VOCAB, PADDED = (32, 640, 4) if SMALL else (2048, 128256, 256)
PAD_ID = 128004 % VOCAB
SMOOTHING = 0.1


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels, ignore_index=PAD_ID, label_smoothing=SMOOTHING)


def get_inputs():
    labels = torch.randint(0, VOCAB, (TOKENS,))
    labels[TOKENS - PADDED:] = PAD_ID
    return [4.0 * torch.randn(TOKENS, VOCAB), labels]


def get_init_inputs():
    return []
