"""GPU timing with CUDA events: warm-up, L2 flushed before every trial, the median of the trials.

Flushing writes a buffer larger than L2 (twice its size), so every trial reads its inputs from HBM as
a real run would, and the flush itself is outside the timed events.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field

DEFAULT_TRIALS = 20
DEFAULT_WARMUP = 3


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    trials: int
    samples: list[float] = field(default_factory=list)
    remeasured: bool = False      # the first set of trials looked disturbed (`disturbed`) and ran again

    def to_dict(self) -> dict:
        d = asdict(self)
        d["samples"] = [round(s, 6) for s in self.samples]
        return d


_flush_buf = {}


def l2_flush_buffer(device=None):
    """A byte buffer twice the L2 size of the device (cached per device)."""
    import torch
    dev = torch.device(device or "cuda")
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    buf = _flush_buf.get(idx)
    if buf is None:
        l2 = getattr(torch.cuda.get_device_properties(idx), "L2_cache_size", 0) or 64 * 2**20
        buf = _flush_buf[idx] = torch.empty(2 * l2, dtype=torch.uint8, device=f"cuda:{idx}")
    return buf


# `stitchcuda bench --jobs N` runs problems in parallel processes on one GPU. A file lock keeps their
# measurements clean: a measurement holds it exclusively, and the untimed GPU work (reference runs,
# verification) holds it shared, so nothing else runs on the GPU while a process times.
TIMING_LOCK_ENV = "STITCHCUDA_TIMING_LOCK"


class _GpuLock:
    """One open file per process; nested holds convert the lock on that file (shared -> exclusive and
    back) rather than taking a second lock that would wait for this process's own first one."""

    def __init__(self):
        self.path: str | None = None
        self.file = None
        self.modes: list[bool] = []      # exclusive? per nested hold

    def _apply(self) -> None:
        import fcntl
        if not self.modes:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            return
        mode = fcntl.LOCK_EX if any(self.modes) else fcntl.LOCK_SH
        try:
            fcntl.flock(self.file, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            from ..agent.phases import phase
            with phase("gpu_wait"):      # another problem holds the GPU: not this agent's own time
                fcntl.flock(self.file, mode)

    @contextlib.contextmanager
    def hold(self, exclusive: bool):
        path = os.environ.get(TIMING_LOCK_ENV)
        if not path:
            yield
            return
        if self.path != path:
            if self.file is not None:
                self.file.close()
            self.file, self.path, self.modes = open(path, "a"), path, []
        self.modes.append(exclusive)
        self._apply()
        try:
            yield
        finally:
            try:
                _drain_gpu()  # no work this process queued may still run once another one can measure
            finally:          # a faulted context raises here again: the lock is let go all the same
                self.modes.pop()
                self._apply()


def _drain_gpu() -> None:
    """Wait for the GPU work this process queued (kernel launches return before the kernels run)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
        torch.cuda.synchronize()


_GPU_LOCK = _GpuLock()


def exclusive_timing():
    """Hold the cross-process GPU lock alone while measuring (no-op without $STITCHCUDA_TIMING_LOCK)."""
    return _GPU_LOCK.hold(True)


def gpu_work():
    """Untimed GPU work (reference runs, verification): shared with other such work, never with a
    measurement (no-op without $STITCHCUDA_TIMING_LOCK)."""
    return _GPU_LOCK.hold(False)


@contextlib.contextmanager
def inductor_benchmarks_as_gpu_work():
    """While torch.compile builds, Inductor times its kernels' candidate configurations on the GPU
    (Triton autotuning): untimed GPU work like a verification, so it holds the lock shared too. Left
    unlocked under `bench --jobs 8`, it ran during other problems' measurements: one cuBLAS GEMM read
    13.6 ms there and 6.2 ms alone."""
    from torch._inductor.runtime import benchmarking
    set_lock = getattr(benchmarking, "set_gpu_benchmark_lock_context", None)
    if set_lock is not None:
        previous = set_lock(gpu_work)
        try:
            yield
        finally:
            set_lock(previous)
        return
    # A torch without that hook: wrap each Benchmarker class's own benchmark_gpu for the span.
    originals = {cls: cls.__dict__["benchmark_gpu"] for cls in vars(benchmarking).values()
                 if isinstance(cls, type) and issubclass(cls, benchmarking.Benchmarker)
                 and "benchmark_gpu" in cls.__dict__}
    for cls, fn in originals.items():
        setattr(cls, "benchmark_gpu", _as_gpu_work(fn))
    try:
        yield
    finally:
        for cls, fn in originals.items():
            setattr(cls, "benchmark_gpu", fn)


def _as_gpu_work(fn):
    def locked(*args, **kwargs):
        with gpu_work():
            return fn(*args, **kwargs)
    return locked


def summarize(samples: list[float]) -> Timing:
    if not samples:
        raise ValueError("no timing samples")
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples), list(samples))


DISTURBED = 1.25   # a median this far above the fastest trial: something else shared the GPU


def disturbed(t: Timing) -> bool:
    """Whether the trials' median sits far above their fastest: work outside this measurement (another
    process's torch.compile running its first call, say) ran during most of them. Under
    `bench --jobs 8` on the H100, a 32 us layer norm read 79.5 us this way."""
    return t.trials >= 3 and t.median_ms > DISTURBED * t.min_ms


def time_gpu(fn, *, trials: int = DEFAULT_TRIALS, warmup: int = DEFAULT_WARMUP, flush: bool = True,
             stream=None) -> Timing:
    """Median time of fn() in ms, measured with CUDA events around each call on the current stream.
    A disturbed set of trials runs once more; the set with the lower median counts."""
    trials = max(1, int(trials))
    with exclusive_timing():
        first = _trials(fn, trials, warmup, flush)
        if not disturbed(first):
            return first
        again = _trials(fn, trials, 0, flush)
    best = min(first, again, key=lambda t: t.median_ms)
    best.remeasured = True
    return best


def _trials(fn, trials: int, warmup: int, flush: bool) -> Timing:
    import torch
    buf = l2_flush_buffer() if flush else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    for _ in range(max(0, warmup)):
        fn()
    torch.cuda.synchronize()
    for i in range(trials):
        if buf is not None:
            buf.fill_(i & 0xFF)   # evict the inputs from L2 (outside the timed span)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) for s, e in zip(starts, ends)])


def time_cpu(fn, *, trials: int = 5, warmup: int = 1) -> Timing:
    """Wall-clock median in ms (for host-side steps: import, plan, compile)."""
    import time
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(max(1, trials)):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return summarize(samples)


def time_in_graph(fn, *, trials: int = DEFAULT_TRIALS, warmup: int = DEFAULT_WARMUP,
                  flush: bool = True) -> tuple[Timing, str]:
    """(timing, how): fn captured into a CUDA graph and its replays timed, which is how the end-to-end
    program runs it (no Python launch overhead on either side of a comparison). When fn cannot be
    captured it is timed as it is ("eager")."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with gpu_work():              # the warm-up (a cuDNN algorithm search, say) is GPU work too
        with torch.cuda.stream(side):
            fn()                  # warm-up outside the capture: lazy loads, workspaces, handles
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=side):
                fn()
            torch.cuda.synchronize()
        except Exception:
            torch.cuda.synchronize()
            return time_gpu(fn, trials=trials, warmup=warmup, flush=flush), "eager"
        try:
            return time_gpu(g.replay, trials=trials, warmup=warmup, flush=flush), "graph"
        finally:
            del g
