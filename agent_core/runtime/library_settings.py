"""torch's library settings changed for the calls inside a `with`, and put back as they were, also
when a call raises: TF32 for the split-TF32 and TF32 forms, cuDNN's timed algorithms, fp32
accumulation for the half-precision forms (runtime/split_tf32.py, runtime/low_precision.py)."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def settings(*changes):
    """(object, attribute, value) settings for the calls inside, then everything as it was, also when a
    call raises."""
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in changes]
    try:
        for obj, attr, value in changes:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in saved:
            setattr(obj, attr, value)


def tf32_tensor_cores():
    """TF32 on for the calls inside, with cuDNN picking their algorithms by timing them (TF32 is part
    of its algorithm cache key, so the fp32 calls elsewhere keep theirs)."""
    import torch
    b = torch.backends
    return settings((b.cuda.matmul, "allow_tf32", True), (b.cudnn, "allow_tf32", True), (b.cudnn, "benchmark", True))


def cudnn_timed():
    """fp32 convolutions whose algorithm cuDNN picks by timing, cached apart from the heuristic picks
    (deterministic is part of the cache key; see runtime/split_tf32.py)."""
    import torch
    return settings((torch.backends.cudnn, "benchmark", True), (torch.backends.cudnn, "deterministic", True))
