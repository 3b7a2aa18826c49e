"""YOLOv5's detection-head decode at inference: sigmoid of the raw head, box centres from the grid
and stride, sizes from the anchors, the class scores passed through (slices, cat), then all anchors
flattened into one list of predictions.

YOLOv5 at 640x640, the stride-8 head: 80x80 cells, 3 anchors, 85 values (4 box, 1 objectness,
80 COCO classes); batch 16.
"""
import os

import torch
import torch.nn as nn

# Real sizes by default; STITCHCUDA_BLOCKS_SMALL=1 shrinks them for the CPU tests only.
SMALL = os.environ.get("STITCHCUDA_BLOCKS_SMALL") == "1"
BATCH, SIDE, CLASSES = (2, 8, 5) if SMALL else (16, 80, 80)
ANCHORS, STRIDE = 3, 8.0
P3_ANCHORS = ((10.0, 13.0), (16.0, 30.0), (33.0, 23.0))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        ys, xs = torch.meshgrid(torch.arange(SIDE), torch.arange(SIDE), indexing="ij")
        self.register_buffer("grid", torch.stack((xs, ys), -1).view(1, 1, SIDE, SIDE, 2).float() - 0.5)
        self.register_buffer("anchor_grid", torch.tensor(P3_ANCHORS).view(1, ANCHORS, 1, 1, 2))

    def forward(self, head: torch.Tensor) -> torch.Tensor:
        y = head.sigmoid()
        xy = (y[..., 0:2] * 2 + self.grid) * STRIDE
        wh = (y[..., 2:4] * 2) ** 2 * self.anchor_grid
        out = torch.cat((xy, wh, y[..., 4:]), dim=-1)
        return out.view(BATCH, -1, 5 + CLASSES)


def get_inputs():
    return [torch.randn(BATCH, ANCHORS, SIDE, SIDE, 5 + CLASSES)]


def get_init_inputs():
    return []
