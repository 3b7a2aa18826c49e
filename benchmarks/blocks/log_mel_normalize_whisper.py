"""Whisper's log-mel normalisation: clamp the mel power spectrogram, take log10, floor each clip at
its own maximum minus 8 (a per-sample global max broadcast back), then (x + 4) / 4.

log10 is written as log(x) / ln(10): the importer maps log but not log10 (see the README).
Whisper: 80 mel bins, 30 s clips at 100 frames/s = 3000 frames; batch 64 clips.
"""
import math
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, MELS, FRAMES = (2, 16, 60) if SMALL else (64, 80, 3000)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, mel_power: torch.Tensor) -> torch.Tensor:
        log_spec = torch.log(mel_power.clamp(min=1e-10)) / math.log(10.0)
        peak = log_spec.amax(dim=(1, 2), keepdim=True)
        log_spec = torch.maximum(log_spec, peak - 8.0)
        return (log_spec + 4.0) / 4.0


def get_inputs():
    return [torch.randn(BATCH, MELS, FRAMES).exp()]


def get_init_inputs():
    return []
