"""Per-token log-probabilities of a GPT-2 sequence: log_softmax over the vocabulary (last axis), then
the log-probability of each next token (gather), as perplexity evaluation and RLHF log-prob passes do.

GPT-2: vocabulary 50257 (odd, not a power of two), context 1024; one sequence of 1024 tokens.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SEQ, VOCAB = (1, 16, 257) if SMALL else (1, 1024, 50257)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, next_tokens: torch.Tensor):
        logprobs = torch.log_softmax(logits, dim=-1)
        return logprobs, torch.gather(logprobs, -1, next_tokens.unsqueeze(-1)).squeeze(-1)


def get_inputs():
    return [4.0 * torch.randn(BATCH, SEQ, VOCAB), torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []
