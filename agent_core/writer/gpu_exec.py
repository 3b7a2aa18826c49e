"""GpuExecutor: a proposed kernel launched on the GPU in a child process, on guarded device buffers.

The parent writes a request folder (request.json: name, grid, block, shared_bytes, guard;
kernel.cu; in.bin in executors.py's buffer format) and runs `python -m agent_core.writer.gpu_exec
REQUEST_DIR`. The child compiles with agent_core.compiler (NVRTC, cached: the entry compile_kernel made
when the loop compiled the proposal; the child imports neither torch nor the codegen, so it starts in
about a second), loads the cubin with cupy.RawModule, copies each buffer to the device whole (its
own cudaMalloc, so memcheck knows its exact bounds), touches `started`, then launches every call on
the default stream, synchronizes, and appends that call's buffers to out.bin. A CUDA error (illegal
address, launch failure) ends the child with the message in error.json: "fault"; NVRTC errors:
"compile". The child has STARTUP_S to get ready and then the
caller's timeout for the launches; past it the process group is killed: "hang".

`run(..., sanitize=True)` runs the child under `compute-sanitizer --tool memcheck --error-exitcode 9`
when it is on PATH (with a longer timeout: memcheck slows kernels down many times); memcheck's
errors become check "sanitizer" with the first lines of its report. Writes into the guard bytes stay
inside the allocation, so memcheck does not see them: the canaries the caller checks do.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .executors import ExecutionError, check_launch, read_buffers, run_child, signal_name, write_buffers, write_header

if TYPE_CHECKING:   # the child never imports torch (agent_core.codegen does): it starts in a fraction of the time
    from ..codegen.kernel import KernelSource

REQUEST, SOURCE, IN, OUT, STARTED, ERROR = "request.json", "kernel.cu", "in.bin", "out.bin", "started", "error.json"
EXIT_COMPILE, EXIT_FAULT = 4, 5
SANITIZE_EXIT = 9
STARTUP_S = 120.0            # importing CuPy, creating the context, compiling on a cache miss
SANITIZE_SLOWDOWN = 20.0     # the launch timeout under memcheck is this many times the caller's
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])   # where `agent_core` is importable from


class GpuExecutor:
    name = "gpu"

    def __init__(self, *, python: str = sys.executable, startup_s: float = STARTUP_S):
        self.python, self.startup_s = python, startup_s

    @staticmethod
    def sanitizer() -> str | None:
        """compute-sanitizer's path, or None where it is not on PATH (then sanitize runs plain)."""
        return shutil.which("compute-sanitizer")

    def run(self, ks: KernelSource, calls: list[list[np.ndarray]], *, guard: int, timeout_s: float = 60.0,
            sanitize: bool = False) -> list[list[np.ndarray]]:
        check_launch(ks, calls, guard)
        with tempfile.TemporaryDirectory(prefix="stitch-gpu-exec-") as tmp:
            work = Path(tmp)
            (work / REQUEST).write_text(json.dumps({"name": ks.name, "grid": list(ks.grid), "block": list(ks.block),
                                                    "shared_bytes": ks.shared_bytes, "guard": guard}))
            (work / SOURCE).write_text(ks.source)
            write_buffers(work / IN, calls)
            cmd = [self.python, "-m", "agent_core.writer.gpu_exec", str(work)]
            tool = self.sanitizer() if sanitize else None
            if tool:
                cmd = [tool, "--tool", "memcheck", "--error-exitcode", str(SANITIZE_EXIT), "--print-limit", "20", *cmd]
                timeout_s *= SANITIZE_SLOWDOWN
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p))
            rc, out, err = run_child(cmd, workdir=work, timeout_s=timeout_s, what=f"{ks.name} on the GPU",
                                     started=work / STARTED, startup_s=self.startup_s, env=env)
            if tool and (rc == SANITIZE_EXIT or re.search(r"ERROR SUMMARY: [1-9]", out + err)):
                raise ExecutionError("sanitizer", sanitizer_message(ks.name, out + "\n" + err))
            if rc != 0:
                raise _child_error(ks.name, work, rc, err)
            return read_buffers(work / OUT)


def sanitizer_message(name: str, report: str) -> str:
    """The summary and the first lines of memcheck's first error, on one line."""
    lines = [ln.strip("= ").strip() for ln in report.splitlines() if ln.startswith("=========")]
    summary = next((ln for ln in lines if ln.startswith("ERROR SUMMARY")), "errors found")
    body = [ln for ln in lines if ln and not ln.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY"))]
    return f"{name}: compute-sanitizer memcheck: {summary}: " + "; ".join(body[:4])


def _child_error(name: str, work: Path, rc: int, stderr: str) -> ExecutionError:
    try:
        said = json.loads((work / ERROR).read_text())
        return ExecutionError(said["check"], said["message"])
    except (OSError, ValueError, KeyError):
        pass
    if rc < 0:
        return ExecutionError("fault", f"{name}: the GPU child died with {signal_name(rc)}")
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), f"exit {rc}")
    return ExecutionError("fault", f"{name}: the GPU child failed: {last}")


# ---- the child ----------------------------------------------------------------------------------
def _fail(work: Path, check: str, message: str, code: int) -> int:
    (work / ERROR).write_text(json.dumps({"check": check, "message": message}))
    print(message, file=sys.stderr)
    return code


def child(work: Path) -> int:
    from ..compiler import CompileError, compile_source
    req = json.loads((work / REQUEST).read_text())
    name, grid, block = req["name"], tuple(req["grid"]), tuple(req["block"])
    shared, guard = int(req["shared_bytes"]), int(req["guard"])
    try:   # compile_kernel(ks) is compile_source(ks.source, ks.name): same options, same cache entry
        compiled = compile_source((work / SOURCE).read_text(), name, canonical=True)
    except CompileError as exc:
        return _fail(work, "compile", str(exc), EXIT_COMPILE)
    import cupy
    cupy.cuda.set_allocator(None)   # a cudaMalloc per buffer: memcheck sees each buffer's exact bounds
    calls, current = [], 0
    try:
        fn = cupy.RawModule(path=str(compiled.path)).get_function(compiled.entry)
        if shared > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = shared
        calls = read_buffers(work / IN)
        device = [[cupy.asarray(b) for b in call] for call in calls]
        cupy.cuda.Device().synchronize()
        (work / STARTED).touch()
        with open(work / OUT, "wb") as f:
            write_header(f, [[b.size for b in call] for call in calls])
            for current, bufs in enumerate(device, start=1):
                fn(grid, block, tuple(b[guard:] for b in bufs), shared_mem=shared)
                cupy.cuda.Device().synchronize()
                for b in bufs:
                    f.write(cupy.asnumpy(b).tobytes())
    except Exception as exc:   # a CUDA error: illegal address, launch failure, no device, bad cubin
        where = f"in call {current} of {len(calls)}" if current else "before the first launch"
        text = str(exc).strip().splitlines()
        return _fail(work, "fault", f"{name} failed on the GPU {where}: {type(exc).__name__}: "
                                    f"{text[0] if text else ''}", EXIT_FAULT)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m agent_core.writer.gpu_exec REQUEST_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(child(Path(sys.argv[1])))
