"""LLaMA's SwiGLU gate on a merged gate/up projection: split the projection in two (chunk), then
silu(gate) * up, as vLLM's SiluAndMul does.

LLaMA-2-7B: intermediate size 11008, so the merged projection is 22016 wide; 4096 tokens
(2 sequences of 2048) per micro-batch.
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
TOKENS, INTERMEDIATE = (32, 344) if SMALL else (4096, 11008)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def get_inputs():
    return [torch.randn(TOKENS, 2 * INTERMEDIATE)]


def get_init_inputs():
    return []
