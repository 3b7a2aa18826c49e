"""What GPU a measurement was made on: its properties, and its copy bandwidth measured once.

The copy bandwidth (a device-to-device copy of 1 GiB, read + write counted) is the roof memory-bound
kernels are held against; it is measured once per machine and cached on disk by device name, driver
and torch version, because it takes a second and does not change.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..compiler import cache_dir


def _cache_file() -> Path:
    return cache_dir().parent / "hardware.json"


def device_properties(index: int = 0) -> dict:
    """name, SM count, L2, shared memory and registers per block, clocks, driver and CUDA versions."""
    import torch
    p = torch.cuda.get_device_properties(index)
    snap = {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sm_count": p.multi_processor_count,
        "total_memory_bytes": p.total_memory,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    try:
        import cupy
        rt = cupy.cuda.runtime
        attrs = rt.getDeviceProperties(index)
        snap.update({
            "shared_bytes_per_block": attrs.get("sharedMemPerBlock"),
            "shared_bytes_per_block_optin": attrs.get("sharedMemPerBlockOptin"),
            "registers_per_block": attrs.get("regsPerBlock"),
            "max_threads_per_block": attrs.get("maxThreadsPerBlock"),
            "clock_khz": attrs.get("clockRate"),
            "memory_clock_khz": attrs.get("memoryClockRate"),
            "memory_bus_bits": attrs.get("memoryBusWidth"),
            "driver_version": rt.driverGetVersion(),
            "runtime_version": rt.runtimeGetVersion(),
        })
    except Exception as exc:  # properties from torch are enough to label a result
        snap["cupy_error"] = f"{type(exc).__name__}: {exc}"
    # CUDA 12+ dropped clockRate from cudaDeviceProp; NVML-free fallback: ask the attribute API
    if not snap.get("clock_khz"):
        try:
            import cupy
            snap["clock_khz"] = cupy.cuda.runtime.deviceGetAttribute(13, index)   # cudaDevAttrClockRate
            snap["memory_clock_khz"] = cupy.cuda.runtime.deviceGetAttribute(36, index)
        except Exception:
            pass
    return snap


def measure_copy_bandwidth(nbytes: int = 2**30, trials: int = 20) -> float:
    """GB/s of a device-to-device copy, read + write counted, L2 flushed, median of trials."""
    import torch
    from .timing import time_gpu
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    t = time_gpu(lambda: dst.copy_(src), trials=trials, warmup=3)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def copy_bandwidth_gbs(props: dict, *, refresh: bool = False) -> tuple[float, bool]:
    """(GB/s, from_cache): the measured copy bandwidth of this device, cached on disk."""
    key = f"{props.get('name')}|{props.get('driver_version')}|{props.get('torch')}"
    path = _cache_file()
    cache = {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    if not refresh and isinstance(cache.get(key), (int, float)):
        return float(cache[key]), True
    gbs = measure_copy_bandwidth()
    cache[key] = gbs
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
    return gbs, False


def hardware_snapshot(index: int = 0, *, measure: bool = True) -> dict:
    """Device properties plus the copy bandwidth: what every optimized result carries."""
    snap = device_properties(index)
    if measure:
        snap["copy_bandwidth_gbs"], snap["copy_bandwidth_cached"] = copy_bandwidth_gbs(snap)
    return snap


def no_gpu_reason() -> str | None:
    """None when a CUDA GPU is usable, else one line saying why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    from ..compiler import device_arch
    if device_arch() is None:
        return "CuPy sees no CUDA GPU"
    return None
