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
        import torch
        from torch.profiler import ProfilerActivity, profile
        with gpu_work():          # never during another problem's measurement (bench --jobs)
            call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(runs):
                    call()
                torch.cuda.synchronize()
        per_run = _kernels_per_run(prof.events(), runs)
    except Exception as exc:  # a profiler already running (a caller's), no CUPTI, ...
        first = (str(exc).strip().splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first[:200]}"}
    return {"kernels": per_run}


def _kernels_per_run(events, runs: int) -> int:
    import torch
    n = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA and is_kernel(e.name))
    return round(n / runs)


def is_kernel(name: str) -> bool:
    """A GPU activity that is a kernel, not a memcpy or memset (CUPTI names those "Memcpy HtoD
    (Pageable -> Device)", "Memset (Device)")."""
    return not name.startswith(("Memcpy", "Memset"))
