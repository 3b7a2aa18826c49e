"""Will a program's tensors fit? Asked before the reference interpreter allocates anything.

A program file may describe tensors far larger than any machine (shapes up to 2^40 elements load).
Without this check the first allocation fails deep inside torch ("internal error"), or worse, succeeds
and the kernel's OOM killer ends the process later. `require_fits` refuses such a program up front
with the bytes it needs and the bytes there are.

What is counted is an upper bound of what one reference run holds at its peak, because the
interpreter keeps every value until the run ends:
- every program input,
- every parameter and constant drawn at random (no stored data), and the stored ones too where they
  are copied (to a GPU, or to another dtype); stored data already in host memory is not counted again,
- every value a node computes (intermediates and outputs),
- on the host, one float64 buffer of the largest tensor drawn at random (draws are made in float64
  and then converted), or, if larger, the scratch of the convolution with the largest output: torch's
  CPU convolutions hold up to twice their output again while they run (conv_transpose3d into 414 MB
  peaked 1.25 GB above its input), which is what ended `plan` of KernelBench's 100_ConvTranspose3d
  in the OOM killer on a 24 GB machine when its rewrite check fitted by the values alone.
Host memory available is /proc/meminfo's MemAvailable (less, if the process's cgroup allows less);
GPU memory is torch.cuda.mem_get_info's free bytes plus what torch's caching allocator holds unused.
"""
from __future__ import annotations

import math

from .errors import StitchError
from .ir import Program, Role, Value

PARTS = ("inputs", "parameters", "computed")


class DoesNotFit(StitchError):
    """The program's tensors need more memory than the host or the device has free."""

    def __init__(self, label: str, reason: str, need: int, available: int):
        super().__init__(f"{label}: {reason}")
        self.reason, self.need, self.available = reason, need, available


def require_fits(program: Program, device: str = "cpu", *, parts=PARTS, label: str | None = None,
                 runs: int = 1) -> None:
    """Raise DoesNotFit if the tensors `parts` of a reference run on `device` cannot be allocated.

    parts: "inputs" (program inputs), "parameters" (parameters and constants), "computed" (every
    node output); a caller names those it is about to allocate or that the run it starts will.
    runs: reference runs held at once (the rewrite check keeps every value of each of its draws):
    inputs and computed values count that many times, the parameters they share once."""
    label = label or f"program '{program.name}'"
    on_gpu = str(device).startswith("cuda")
    counted = list(_counted(program, parts, on_gpu))
    total = sum(v.nbytes * (1 if v.role in (Role.PARAMETER, Role.CONSTANT) else runs) for v in counted)
    drawn = [v for v in counted if _drawn(program, v)]
    draw_buffer = max((math.prod(v.shape) * 8 for v in drawn), default=0)
    if "computed" in parts:    # one at a time, like the draws: the largest of the transients counts
        draw_buffer = max(draw_buffer, _op_scratch(program))
    if on_gpu:
        # the draw happens on the host first (float64, then the value's dtype), then it is copied
        host_need = max((math.prod(v.shape) * 8 + v.nbytes for v in drawn), default=0)
        checks = [(total, _gpu_free(device), f"the GPU ({_gpu_name(device)}) has {{}} free"),
                  (host_need, host_available(), "this machine has {} of memory free")]
    else:
        checks = [(total + draw_buffer, host_available(), "this machine has {} of memory free")]
    for need, available, where in checks:
        if available is not None and need > available:
            big = max(counted, key=lambda v: v.nbytes)
            held = f"{runs} draws of its inputs and values at once; " if runs > 1 else ""
            reason = (f"the program needs {fmt_bytes(need)} for its tensors ({held}largest: {big.id} '{big.name}' "
                      f"{big.dtype}[{', '.join(map(str, big.shape))}], {fmt_bytes(big.nbytes)}), "
                      f"{where.format(fmt_bytes(available))}; use smaller shapes or a larger machine")
            raise DoesNotFit(label, reason, need, available)


def _counted(program: Program, parts, on_gpu: bool):
    for v in program.values.values():
        if v.role == Role.INPUT:
            if "inputs" in parts:
                yield v
        elif v.role in (Role.PARAMETER, Role.CONSTANT):
            if "parameters" in parts and (on_gpu or _drawn(program, v) or _converted(program, v)):
                yield v
        elif "computed" in parts:
            yield v


def _op_scratch(program: Program) -> int:
    """Host bytes the op with the largest scratch holds while it runs, beyond its output (OpDef.host_scratch)."""
    return max((n.opdef.host_scratch * program.values[n.outputs[0]].nbytes for n in program.nodes.values()
                if n.opdef.host_scratch and n.outputs and n.outputs[0] in program.values), default=0)


def _drawn(program: Program, v: Value) -> bool:
    """Made by reference.draw: inputs, and parameters or constants without stored data."""
    return v.role == Role.INPUT or v.role in (Role.PARAMETER, Role.CONSTANT) and program.data.get(v.id) is None


def _converted(program: Program, v: Value) -> bool:
    """Stored data that the reference copies into another dtype (bfloat16 weights are stored as float32)."""
    arr = program.data.get(v.id)
    return arr is not None and (getattr(arr, "dtype", None) is None or arr.dtype.name != v.dtype)


def host_available() -> int | None:
    """Bytes of host memory this process can still allocate, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    cgroup = _cgroup_room()
    return avail if cgroup is None else min(avail, cgroup)


def _cgroup_room() -> int | None:
    """What the process's memory cgroup still allows (v2, then v1), or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(0, int(limit) - usage)
    return None


def _gpu_free(device: str) -> int | None:
    import torch
    if not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    free, _total = torch.cuda.mem_get_info(dev)
    return free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)


def _gpu_name(device: str) -> str:
    import torch
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return f"cuda:{index}, {torch.cuda.get_device_name(index)}"


def fmt_bytes(n: float) -> str:
    """Binary units, one decimal: 4000000000000 -> '3.6 TiB'."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
