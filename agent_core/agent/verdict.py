"""What a region's kernel is measured against: what the program pays for the same outputs when the
region runs through torch instead.

The region's ops one by one is not that cost when they leave views: a permute, transpose, expand or
slice is free in torch, and the copy it implies is paid later, by whatever reads the view (a
`.contiguous()`, a reshape that cannot be a view, the next generated kernel's contiguous input).
A kernel always writes its outputs contiguous, so the torch path is timed writing them contiguous
too: a layout-only region is then compared with the copy it replaces, not with a free relabel.
"""
from __future__ import annotations


def torch_path(runner, ins):
    """The region's outputs computed through torch as the program would need them: its ops one by
    one, then each output that is a strided view materialised (a no-op for contiguous ones)."""
    return [t.contiguous() for t in runner.run_unfused(ins)]


def views_copied(outs) -> bool:
    """Whether the torch path had to copy an output that its ops left as a view."""
    return any(not t.is_contiguous() for t in outs)
