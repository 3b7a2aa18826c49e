"""CLIP's symmetric contrastive loss: L2-normalise image and text embeddings, scaled cosine logits
(one matmul), cross entropy over the rows (image to text) and over the columns (text to image,
a non-last axis through the transpose), averaged.

CLIP ViT-B/32: embedding width 512, learned logit scale initialised at ln(1/0.07); a local batch
of 4096 pairs on one GPU.
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
PAIRS, WIDTH = (64, 32) if SMALL else (4096, 512)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, image_embeds: torch.Tensor, text_embeds: torch.Tensor) -> torch.Tensor:
        image = F.normalize(image_embeds, dim=-1)
        text = F.normalize(text_embeds, dim=-1)
        logits = self.logit_scale.exp() * image @ text.t()
        labels = torch.arange(logits.shape[0], device=logits.device)
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2


def get_inputs():
    return [torch.randn(PAIRS, WIDTH), torch.randn(PAIRS, WIDTH)]


def get_init_inputs():
    return []
