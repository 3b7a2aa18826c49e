"""Run a proposed kernel on guarded buffers, always in a child process with a timeout.

A proposal may fault, hang or scribble over memory, and an illegal address would poison the parent's
CUDA context for the rest of the run, so neither executor runs it in this process:
- `CpuExecutor` (emulate.py): the CUDA source compiled by g++ against emulate_shim.h and run with each
  block's threads as fibers on one CPU thread; needs no GPU, so the gate's checks run on any machine;
- `GpuExecutor` (gpu_exec.py): `python -m agent_core.writer.gpu_exec REQUEST_DIR` loads the NVRTC cubin
  with CuPy and launches on real device buffers (optionally under compute-sanitizer memcheck).

The contract both keep (`Executor.run`): each array of a call is ONE kernel argument, a 1-D uint8
buffer of `guard + nbytes + guard` bytes; the kernel gets a pointer `guard` bytes into it (keep
`guard` a multiple of 256 so that pointer is aligned like a fresh allocation). Calls run in order in
one process and one loaded module, so state a kernel keeps between launches shows up. The result
holds every buffer, guards included, as it was right after its call; judging it (canaries, inputs
left alone, outputs against the reference) is the caller's job. Failures raise ExecutionError with
`.check` "fault" (the child died: a signal or a CUDA error, with its message), "hang" (timeout),
"compile" (NVRTC), "sanitizer" (memcheck found errors) or "unsupported" (the CPU emulator cannot
run the source, and says which construct).

The buffer file both children read and write (`write_buffers` / `read_buffers`): the magic
`STBUF001`, a little-endian u64 call count, per call a u64 argument count and one u64 byte count per
argument, then every buffer's bytes in order, without padding. The output file has the same layout.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from .endpoint import WriterError

if TYPE_CHECKING:   # the GPU child imports this module and must not pay for torch
    from ..codegen.kernel import KernelSource

MAGIC = b"STBUF001"
CANARY = 0xA5                  # what `guarded` fills the guard bytes with
MAX_BLOCK_THREADS = 1024
MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 232448      # 227 KiB of dynamic shared memory per block (H100/H200); emulate_shim.h agrees


class ExecutionError(WriterError):
    """Running a proposal failed; `.check` says how (fault, hang, compile, sanitizer, unsupported)."""

    def __init__(self, check: str, message: str):
        super().__init__(message)
        self.check = check
        self.reason = message


@runtime_checkable
class Executor(Protocol):
    name: str

    def run(self, ks: KernelSource, calls: list[list[np.ndarray]], *, guard: int, timeout_s: float = 60.0,
            sanitize: bool = False) -> list[list[np.ndarray]]:
        """Every buffer of every call after that call (see the module docstring)."""


# ---- guarded buffers -----------------------------------------------------------------------------
def guarded(array, guard: int, fill: int = CANARY) -> np.ndarray:
    """`array`'s bytes with `guard` bytes of `fill` on each side: one kernel argument."""
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    buf = np.full(guard + data.size + guard, fill, dtype=np.uint8)
    buf[guard:guard + data.size] = data
    return buf


def payload(buf: np.ndarray, guard: int, dtype, shape) -> np.ndarray:
    """The array between the guards of a buffer `guarded` made."""
    return buf[guard:len(buf) - guard].view(dtype).reshape(shape)


# ---- the buffer file -----------------------------------------------------------------------------
def write_header(f, sizes: list[list[int]]) -> None:
    words = [len(sizes)]
    for call in sizes:
        words += [len(call), *call]
    f.write(MAGIC)
    f.write(np.asarray(words, dtype="<u8").tobytes())


def write_buffers(path, calls: list[list[np.ndarray]]) -> None:
    bufs = [[np.ascontiguousarray(b).reshape(-1).view(np.uint8) for b in call] for call in calls]
    with open(path, "wb") as f:
        write_header(f, [[b.size for b in call] for call in bufs])
        for call in bufs:
            for b in call:
                f.write(b.tobytes())


def read_buffers(path) -> list[list[np.ndarray]]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw[:8].tobytes() != MAGIC:
        raise ExecutionError("fault", f"{path} is not a buffer file")
    pos = 8

    def word() -> int:
        nonlocal pos
        v = int(raw[pos:pos + 8].view("<u8")[0])
        pos += 8
        return v

    sizes = []
    for _ in range(word()):
        sizes.append([word() for _ in range(word())])
    calls = []
    for call in sizes:
        calls.append([])
        for n in call:
            if pos + n > raw.size:
                raise ExecutionError("fault", f"{path} is truncated")
            calls[-1].append(raw[pos:pos + n].copy())
            pos += n
    return calls


# ---- checks and the child process both executors share ------------------------------------------
def check_launch(ks: KernelSource, calls: list[list[np.ndarray]], guard: int) -> None:
    """What a GPU would refuse at launch, said before anything runs."""
    threads = int(np.prod(ks.block))
    problem = None
    if len(ks.grid) != 3 or len(ks.block) != 3 or min(*ks.grid, *ks.block) < 1:
        problem = f"grid {tuple(ks.grid)} and block {tuple(ks.block)} need three positive sizes each"
    elif threads > MAX_BLOCK_THREADS:
        problem = f"a block of {threads} threads (at most {MAX_BLOCK_THREADS})"
    elif any(g > m for g, m in zip(ks.grid, MAX_GRID)):
        problem = f"grid {tuple(ks.grid)} exceeds {MAX_GRID}"
    elif not 0 <= ks.shared_bytes <= MAX_SHARED_BYTES:
        problem = f"{ks.shared_bytes} bytes of dynamic shared memory (at most {MAX_SHARED_BYTES})"
    if problem:
        raise ExecutionError("fault", f"{ks.name}: invalid launch configuration: {problem}")
    for k, call in enumerate(calls):
        for j, b in enumerate(call):
            if b.dtype != np.uint8 or b.ndim != 1 or b.size < 2 * guard:
                raise ExecutionError("fault", f"{ks.name}: call {k + 1} argument {j}: expected a 1-D uint8 "
                                              f"buffer of at least 2 x {guard} guard bytes, got {b.dtype}{b.shape}")


def run_child(cmd: list[str], *, workdir: Path, timeout_s: float, what: str, started: Path | None = None,
              startup_s: float = 0.0, env: dict | None = None) -> tuple[int, str, str]:
    """Run `cmd` in its own process group; (returncode, stdout tail, stderr tail).

    With `started`, the child has `startup_s` to create that file (compiling, loading, copying
    buffers in) and then `timeout_s` for the launches; without, `timeout_s` for everything. Past
    the deadline the whole group is killed (compute-sanitizer runs the kernel in a grandchild) and
    ExecutionError("hang") says so."""
    out_path, err_path = workdir / "child.stdout", workdir / "child.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        try:
            if started is None:
                _wait(proc, timeout_s, f"{what} ran past its {timeout_s:g} s timeout (killed)")
            else:
                phase_end = time.monotonic() + startup_s
                while not started.exists():
                    if proc.poll() is not None:
                        break
                    if time.monotonic() > phase_end:
                        raise ExecutionError("hang", f"{what} did not start within {startup_s:g} s (killed)")
                    time.sleep(0.02)
                else:
                    _wait(proc, timeout_s, f"{what} ran past its {timeout_s:g} s timeout (killed)")
            proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)   # the group we started, and only it
                proc.wait()
    return proc.returncode, _tail(out_path), _tail(err_path)


def _wait(proc: subprocess.Popen, timeout_s: float, message: str) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ExecutionError("hang", message) from None


def _tail(path: Path, limit: int = 20000) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - limit))
        return f.read().decode(errors="replace")


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
