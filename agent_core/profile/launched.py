"""How many kernels a call launches on the GPU, counted by the profiler (CUPTI) as they run: the same
measure for ours, torch eager and every torch.compile mode (issue #14: never more kernels than
Inductor). Counting code instead undercounts whatever launches several kernels per call: cuDNN and
cuBLAS calls (a convolution and its bias add), Inductor's extern calls such as the fused
TransformerEncoderLayer, an RNN's per-step kernels. Kernels inside a replayed CUDA graph are counted
one by one; memory copies and sets are not kernels and are left out.
"""
from __future__ import annotations

RUNS = 3


def launched_kernels(call, runs: int = RUNS) -> dict:
    """{"kernels": per call (those of `runs` profiled calls, after one unprofiled call, over `runs`)}
    or {"error": why}. Never raises: a count is diagnostic, not a reason to lose a measurement."""
    from .timing import gpu_work
    try:
        with gpu_work():          # never during another problem's measurement (bench --jobs)
            events = gpu_activity(call, runs)
    except Exception as exc:  # a profiler already running (a caller's), no CUPTI, ...
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first[:200]}"}
    return {"kernels": round(sum(1 for name, _ in events if is_kernel(name)) / runs)}


def gpu_activity(call, runs: int) -> list[tuple[str, float]]:
    """(name, GPU microseconds) of everything `runs` calls ran on the GPU (kernels, memcpys, memsets),
    profiled after one unprofiled call (which loads modules and allocates)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            call()
        torch.cuda.synchronize()
    return [(e.name, e.device_time_total) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def is_kernel(name: str) -> bool:
    """A GPU activity that is a kernel, not a memcpy or memset (CUPTI names those "Memcpy HtoD
    (Pageable -> Device)", "Memset (Device)")."""
    return not name.startswith(("Memcpy", "Memset"))
