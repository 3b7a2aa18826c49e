"""Profiling: CUDA-event timing with L2 flushed, the hardware snapshot, baselines, attribution."""
from .attribution import attribute, floor_ms  # noqa: F401
from .timing import Timing, summarize, time_cpu, time_gpu  # noqa: F401
