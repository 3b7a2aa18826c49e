"""Per-kernel attribution: what bounds a kernel (memory, compute or launches) and how close it is to
its floor. The floor of a memory-bound kernel is (bytes read once + bytes written) / measured copy
bandwidth; a compute-bound one's is FLOPs / peak; below a few microseconds the launch dominates.
"""
from __future__ import annotations

LAUNCH_BOUND_MS = 0.004    # a kernel this short is mostly launch latency and tail effects
LAUNCH_FLOOR_MS = 0.002    # work whose floor is under ~2 us is hidden by launch and event latency
FP32_TFLOPS = 51.0         # the H200's measured fp32 cuBLAS peak (DESIGN.md)
TF32_TFLOPS = 418.0        # its measured TF32 cuBLAS rate (1024x8192x8192 in 0.329 ms, tools/tf32x3_probe.py)


def effective_tflops(flops: float, split_tf32_flops: float, one_product_flops: float = 0.0) -> float:
    """The compute rate a program's floor uses when split_tf32_flops of its flops run as split TF32
    (three TF32 products each, runtime.split_tf32), one_product_flops as one tensor-core product (TF32,
    fp16 or bf16 where the program allows them, runtime.low_precision; all at TF32's measured rate, the
    only one measured) and the rest in fp32."""
    rest = flops - split_tf32_flops - one_product_flops
    seconds = rest / FP32_TFLOPS + (3 * split_tf32_flops + one_product_flops) / TF32_TFLOPS
    return flops / seconds if seconds > 0 else FP32_TFLOPS


def floor_ms(nbytes: float, bandwidth_gbs: float, flops: float = 0.0, tflops: float = FP32_TFLOPS) -> float:
    mem = nbytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs else 0.0
    comp = flops / (tflops * 1e12) * 1e3 if tflops else 0.0
    return max(mem, comp)


def attribute(ms: float, nbytes: float, flops: float, bandwidth_gbs: float, *, tflops: float = FP32_TFLOPS,
              resources: dict | None = None) -> dict:
    mem = nbytes / (bandwidth_gbs * 1e9) * 1e3 if bandwidth_gbs else 0.0
    comp = flops / (tflops * 1e12) * 1e3
    floor = max(mem, comp)
    if (ms < LAUNCH_BOUND_MS or floor < LAUNCH_FLOOR_MS) and floor < ms / 2:
        bound = "launch"
    else:
        bound = "compute" if comp > mem else "memory"
    out = {"ms": ms, "bound": bound, "floor_ms": floor, "pct_of_floor": (100.0 * floor / ms) if ms > 0 else None,
           "achieved_gbs": (nbytes / (ms * 1e-3) / 1e9) if ms > 0 else None,
           "achieved_tflops": (flops / (ms * 1e-3) / 1e12) if ms > 0 else None,
           "bytes": int(nbytes), "flops": int(flops)}
    if resources:
        out.update(resources)
    return out
