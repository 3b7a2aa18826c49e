"""`bench --ray`: each problem a Ray task in its own worker process, one GPU each.

The driver keeps as many problems in flight as the cluster has GPUs (CPUs with --cpu or on a CPU-only
cluster), so a timed problem never shares its GPU, and records every result through bench's own
_Run, so the JSON lines are today's with the host and GPU of each row. A task first reports where it
runs (a streaming generator's first item), then its record. A worker that dies (a faulting kernel,
an out-of-memory kill, a lost node) costs only its problem: it is run once more, on another node when
the cluster has one, then recorded as failed with both reasons. Ctrl+C cancels every task in flight
and stops the driver between two lines, so the file holds whole lines only.

What a task receives: the program file named on the command line (and its .npz sidecar), bench's
flags and the kernel cache's path. Nothing else of the driver's machine travels.
"""
from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field

from .connect import cluster, has_gpus, slots
from .progress import Progress
from .tasks import ATTEMPTS, Interrupt, reason, retry_options, where, worker_died


def shipped_files(path: str) -> dict[str, bytes]:
    """The bytes a task needs of problem `path`: the file, and a program file's parameter sidecar."""
    out = {}
    for p in (path, path + ".npz"):
        if p == path or (path.endswith(".json") and os.path.isfile(p)):
            with open(p, "rb") as f:
                out[os.path.basename(p)] = f.read()
    return out


def _gpu_name() -> str | None:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


def problem_task(files: dict[str, bytes], name: str, args, no_compile: bool, problem_fn, kernel_cache):
    """Runs in a Ray worker: first where it runs, then bench's record of the problem (problem_fn is
    bench.run_one, passed in so this module does not import bench, which imports it)."""
    import tempfile
    here = where()
    yield {"started": True, **here}
    if kernel_cache:                      # compiler.cache_dir() reads it on every compile
        os.environ["STITCHCUDA_CACHE"] = kernel_cache
    with tempfile.TemporaryDirectory(prefix="stitchcuda-ray-") as tmp:
        for base, data in files.items():
            with open(os.path.join(tmp, base), "wb") as f:
                f.write(data)
        rec = problem_fn(os.path.join(tmp, name), args, no_compile)
    rec["host"] = here["host"]
    rec["gpu_name"] = _gpu_name() if rec.get("gpu") else None
    yield rec


@dataclass
class _Flight:
    i: int
    path: str
    attempt: int
    gen: object
    no_compile: bool
    t0: float = field(default_factory=time.monotonic)
    where: dict | None = None
    first_failure: str | None = None


class _Driver:
    def __init__(self, ray, state, problem_fn, kernel_cache, events):
        self.ray, self.state, self.args = ray, state, state.args
        self.gpu = not self.args.cpu and has_gpus(ray)
        need = {"num_gpus": 1} if self.gpu else {"num_cpus": 1}
        self.remote = ray.remote(num_returns="streaming", max_retries=0, **need)(problem_task)
        self.problem_fn, self.kernel_cache, self.events = problem_fn, kernel_cache, events
        self.flights: list[_Flight] = []

    def submit(self, i: int, path: str, attempt: int = 1, *, avoid: str | None = None, no_compile=None):
        opts = retry_options(self.ray, avoid, self.gpu)
        no_compile = self.state.no_compile() if no_compile is None else no_compile
        gen = self.remote.options(**opts).remote(shipped_files(path), os.path.basename(path), self.args, no_compile,
                                                 self.problem_fn, self.kernel_cache)
        flight = _Flight(i, path, attempt, gen, no_compile)
        self.flights.append(flight)
        return flight

    def advance(self, f: _Flight):
        """The next item of a task that has one: where it started, or its record (None: running on)."""
        try:
            item = self.ray.get(next(f.gen))
        except StopIteration:
            return self.died(f, "the task ended without a record")
        except Exception as exc:  # noqa: BLE001 -- Ray's errors for a lost worker, and a task's own
            if worker_died(self.ray, exc):
                return self.died(f, reason(exc))
            return self.fail(f, f"the problem's task failed: {reason(exc)}")
        if item.get("started"):
            f.where = item
            self.flights.append(f)
            return None
        if f.first_failure:
            item.update(attempts=f.attempt, retried_after=f.first_failure)
        return self.finish(f, item)

    def died(self, f: _Flight, why: str):
        host = (f.where or {}).get("host", "?")
        if f.attempt < ATTEMPTS:
            retry = self.submit(f.i, f.path, f.attempt + 1, avoid=(f.where or {}).get("node_id"),
                                no_compile=f.no_compile)
            retry.first_failure = f"the worker on {host} died: {why}"
            return None
        return self.fail(f, f"the worker died on both attempts ({f.first_failure}; then on {host}: {why})")

    def fail(self, f: _Flight, error: str):
        name = os.path.splitext(os.path.basename(f.path))[0]      # bench's problem_name (bench imports us)
        return self.finish(f, {"problem": name, "file": f.path, "ok": False, "error": error,
                               "attempts": f.attempt, "host": (f.where or {}).get("host"),
                               "seconds": round(time.monotonic() - f.t0, 2)})

    def finish(self, f: _Flight, rec: dict) -> dict:
        rec["file"] = f.path                            # the driver's name for it, not the worker's copy
        rec["jobs"] = 1 if self.gpu else slots(self.ray, False)   # > 1: problems shared the CPUs
        rec["ray"] = True
        self.state.record(f.i, rec, no_compile=f.no_compile)
        return rec

    def overdue(self) -> list[_Flight]:
        """Tasks past the problem's --timeout (plus start-up) that bench's own guard did not stop."""
        limit = self.args.timeout + 60
        return [f for f in self.flights if time.monotonic() - f.t0 > limit]

    def cancel_all(self) -> None:
        for f in self.flights:
            self.ray.cancel(f.gen, force=True)
        self.flights.clear()


def run_on_ray(state, todo: list[tuple[int, str]], problem_fn, *, address: str, kernel_cache: str | None,
               events=None) -> None:
    """Run `todo` ((index, path) pairs) on the cluster at `address`, recording through `state` (bench's
    _Run). KeyboardInterrupt after Ctrl+C, once every task was cancelled."""
    if kernel_cache is None and address == "local":
        from ..compiler import cache_dir
        kernel_cache = str(cache_dir().parent)         # the driver's own cache: this machine's workers share it
    kernel_cache = os.path.abspath(kernel_cache) if kernel_cache else None
    with cluster(address) as ray:
        d = _Driver(ray, state, problem_fn, kernel_cache, events)
        queue = collections.deque(todo)
        progress = Progress(len(todo), emit=events)
        with Interrupt() as stop:
            try:
                while (queue or d.flights) and not stop.is_set():
                    while queue and len(d.flights) < slots(ray, d.gpu):
                        i, path = queue.popleft()
                        if state.capped():
                            progress.clear()
                            rec = d.finish(_Flight(i, path, 0, None, False), state.skipped(path))
                            progress.update(running=len(d.flights), finished=rec)
                        else:
                            d.submit(i, path)
                    ready, _ = ray.wait([f.gen for f in d.flights], num_returns=1, timeout=0.5)
                    for f in [f for f in d.flights if any(f.gen is g for g in ready)]:
                        d.flights.remove(f)
                        progress.clear()
                        rec = d.advance(f)
                        progress.update(running=len(d.flights), finished=rec)
                    for f in d.overdue():
                        ray.cancel(f.gen, force=True)
                        d.flights.remove(f)
                        progress.clear()
                        rec = d.fail(f, f"timed out after {state.args.timeout + 60:.0f} s (its worker was killed)")
                        progress.update(running=len(d.flights), finished=rec)
            finally:
                progress.close()
                if d.flights:             # Ctrl+C, or an error of the driver's own: nothing keeps running
                    d.cancel_all()
        if events is not None:
            events.emit("done", status="interrupted" if stop.is_set() else "done")
        if stop.is_set():
            raise KeyboardInterrupt
