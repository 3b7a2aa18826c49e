"""DistilBERT's soft-target distillation loss: KL(softmax(teacher / T) || softmax(student / T)) * T^2,
batchmean, over the masked-LM vocabulary.

DistilBERT / BERT-base: vocabulary 30522, temperature 2.0; 2048 predicted positions per micro-batch
(16 sequences of 128 tokens).
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
POSITIONS, VOCAB = (32, 305) if SMALL else (2048, 30522)
TEMPERATURE = 2.0


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        student = F.log_softmax(student_logits / TEMPERATURE, dim=-1)
        teacher = F.softmax(teacher_logits / TEMPERATURE, dim=-1)
        return F.kl_div(student, teacher, reduction="batchmean") * TEMPERATURE ** 2


def get_inputs():
    return [4.0 * torch.randn(POSITIONS, VOCAB), 4.0 * torch.randn(POSITIONS, VOCAB)]


def get_init_inputs():
    return []
