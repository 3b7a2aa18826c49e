"""BERT's embedding layer: word embedding + position embedding + token-type embedding, then
LayerNorm (eps 1e-12); dropout is off at inference.

BERT-base uncased: vocabulary 30522, 512 positions, 2 token types, width 768; batch 32
sequences of 512 tokens.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, VOCAB, WIDTH = (2, 16, 300, 48) if SMALL else (32, 512, 30522, 768)
MAX_POSITIONS = 512


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(MAX_POSITIONS, WIDTH)
        self.token_types = nn.Embedding(2, WIDTH)
        self.norm = nn.LayerNorm(WIDTH, eps=1e-12)
        self.register_buffer("position_ids", torch.arange(MAX_POSITIONS).unsqueeze(0))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.shape[1]]
        x = self.words(input_ids) + self.positions(positions) + self.token_types(token_type_ids)
        return self.norm(x)


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, 2, (BATCH, SEQ))]


def get_init_inputs():
    return []
