"""`optimize --ray`: each region's tuning trials as one Ray task on the cluster's workers.

The driver plans the program as today and, before its region loop, starts one task per region that
generates a kernel: the task receives the planned program (once, through the object store), the
region's nodes and kind, and the tuning flags. On a GPU worker (`num_gpus=1`) it generates, compiles,
loads, verifies on one draw and times every parameter variant, and times the default kernel there too,
so a variant is compared with the default on the GPU that timed both. On a CPU-only cluster (or with
--cpu) it generates and compiles the variants into the shared kernel cache, as the loop does without
a GPU. The driver's loop then takes each region's result when it reaches the region: on a GPU the
variant the worker found fastest is verified and timed again on the driver's GPU, where the region's
full verification, the end-to-end program and its timing stay, as without --ray.

A worker that dies costs only its region's trials: they run once more, elsewhere when the cluster has
another node, then the region keeps its default parameters with the reason in its outcome. Ctrl+C
(a KeyboardInterrupt in the driver) cancels every task still running.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace

from .connect import cluster, has_gpus
from .tasks import ATTEMPTS, reason, retry_options, where, worker_died


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_PROGRAMS: dict[str, object] = {}      # a worker process keeps the last program it loaded (regions share it)


def _program(text: str):
    key = _sha(text)
    if key not in _PROGRAMS:
        from ..project_file import loads
        _PROGRAMS.clear()
        _PROGRAMS[key] = loads(text)
    return _PROGRAMS[key]


def region_trials(program_text: str, rid: str, nodes: list, kind: str, name: str, opts: dict):
    """Runs in a Ray worker: first where it runs, then the region's trials ({"trials": [...], ...}).
    opts: gpu, sm_count, tune_trials, trials, arch, kernel_cache, lock ((host, path) of the driver's
    GPU timing lock: a worker on the driver's host times under it, never beside the driver)."""
    here = where()
    yield {"started": True, **here}
    if opts.get("kernel_cache"):                       # compiler.cache_dir() reads it on every compile
        os.environ["STITCHCUDA_CACHE"] = opts["kernel_cache"]
    lock = opts.get("lock")
    if lock and lock[0] == socket.gethostname():
        from ..profile.timing import TIMING_LOCK_ENV
        os.environ[TIMING_LOCK_ENV] = lock[1]
    from ..agent.tune import tune_space
    from ..codegen import generate_kernel
    prog = _program(program_text)
    region = SimpleNamespace(id=rid, nodes=list(nodes), kind=kind)
    ks = generate_kernel(prog, region.nodes, name=name, kind=kind)
    variants = tune_space(ks, sm_count=opts["sm_count"], limit=opts["tune_trials"])
    out = {"default_sha": _sha(ks.source), **here}
    if opts["gpu"]:
        out.update(_timed_trials(prog, region, ks, variants, opts))
    else:
        out["trials"] = _compiled_variants(prog, region, name, variants, opts["arch"])
    yield out


def _compiled_variants(prog, region, name, variants, arch) -> list[dict]:
    from ..codegen import generate_kernel
    from ..compiler import compile_kernel
    from ..errors import StitchError
    recs = []
    for i, params in enumerate(variants, 1):
        try:
            compile_kernel(generate_kernel(prog, region.nodes, name=name, kind=region.kind, params=params), arch=arch)
            recs.append({"trial": i, "params": params, "ok": True})
        except StitchError as exc:      # the loop's _compile_variants warns of these too
            recs.append({"trial": i, "params": params, "ok": False, "reason": str(exc)})
    return recs


def _timed_trials(prog, region, ks, variants, opts) -> dict:
    """The loop's own trial (generate, compile, load, verify on one draw, time) for every variant, on
    this worker's GPU, and the default kernel timed on the same inputs."""
    import torch

    from ..agent.events import EventEmitter
    from ..agent.loop import _Agent
    from ..agent.refcache import ReferenceCache
    from ..codegen import region_io
    from ..compiler import compile_kernel
    from ..profile.baselines import strict_fp32
    from ..runtime.launch import load_kernel
    strict_fp32()
    agent = _Agent(prog, EventEmitter(), None, True, 1, False, opts["tune_trials"], opts["trials"], None)
    io = region_io(prog, region.nodes)
    agent.ref = ReferenceCache(prog, set(io.inputs) | set(io.outputs),
                               device=ReferenceCache.choose_device(prog, True))
    runner = agent._runner(region, ks, load_kernel(ks, prog, compile_kernel(ks)))
    ins = agent._region_tensors(ks, runner.inputs)
    default_ms = agent._time(runner, ins).median_ms
    recs = []
    for i, params in enumerate(variants, 1):
        rec, _ = agent._trial(region, ks.name, i, params, ins)
        recs.append({**rec, "variant": params})      # the parameters asked for, to build it again
    return {"default_ms": default_ms, "trials": recs, "gpu_name": torch.cuda.get_device_name(0)}


@dataclass
class _Job:
    region: object
    name: str
    attempt: int = 1
    gen: object = None
    where: dict | None = None
    first_failure: str | None = None


class RayTuner:
    """The driver's side: start() submits every region's task, region() / compiled() take one
    region's result in the loop (agent.loop._Agent), cancel() stops whatever still runs."""

    def __init__(self, ray, kernel_cache: str | None, lock: tuple | None = None):
        self.ray, self.kernel_cache, self.lock = ray, kernel_cache, lock
        self.jobs: dict[str, _Job] = {}

    def start(self, prog, regions, name_of, *, gpu: bool, sm_count: int, tune_trials: int, trials: int, emit):
        """Submit the trials of `regions`; None (tune here) when the driver has a GPU the cluster lacks."""
        from ..agent.region_kinds import without_kernel
        from ..compiler import DEFAULT_ARCH
        from ..project_file import dumps
        self.cancel()
        if gpu and not has_gpus(self.ray):
            emit.log("--ray: the cluster has no GPU to time trials on; they run here (pass --cpu to compile "
                     "them on the cluster instead)", level="warning")
            return None
        self.gpu, self.emit = gpu, emit
        need = {"num_gpus": 1} if gpu else {"num_cpus": 1}
        self.remote = self.ray.remote(num_returns="streaming", max_retries=0, **need)(region_trials)
        self.program = self.ray.put(dumps(prog))             # sent once; every task reads it from the store
        self.opts = {"gpu": gpu, "sm_count": sm_count, "tune_trials": tune_trials, "trials": trials,
                     "arch": None if gpu else DEFAULT_ARCH, "kernel_cache": self.kernel_cache, "lock": self.lock}
        for r in regions:
            if without_kernel(prog, r.nodes) is None:     # the regions the loop generates a kernel for
                self.jobs[r.id] = self._submit(_Job(r, name_of(r)))
        emit.log(f"--ray: the tuning trials of {len(self.jobs)} region(s) were sent to the cluster "
                 f"({'one GPU' if gpu else 'one CPU'} each)", level="info")
        return self

    def _submit(self, job: _Job, avoid: str | None = None) -> _Job:
        r = job.region
        job.gen = self.remote.options(name=f"trials:{r.id}", **retry_options(self.ray, avoid, self.gpu)).remote(
            self.program, r.id, list(r.nodes), r.kind, job.name, self.opts)
        return job

    def _result(self, r, ks) -> tuple[dict | None, str | None]:
        """(the task's result, None) or (None, why the region's trials are lost)."""
        job = self.jobs.pop(r.id, None)
        if job is None:
            return None, "no trials task was started for it"
        while True:
            try:
                item = self.ray.get(next(job.gen))
                if item.get("started"):
                    job.where = item
                    continue
                break
            except Exception as exc:  # noqa: BLE001 -- Ray's errors for a lost worker, and a task's own
                died = isinstance(exc, StopIteration) or worker_died(self.ray, exc)
                if not died:
                    return None, f"the trials' task failed: {reason(exc)}"
                host = (job.where or {}).get("host", "?")
                why = "the task ended without a result" if isinstance(exc, StopIteration) else reason(exc)
                if job.attempt >= ATTEMPTS:
                    return None, f"the worker died on both attempts ({job.first_failure}; then on {host}: {why})"
                job.first_failure = f"the worker on {host} died: {why}"
                job.attempt += 1
                self.emit.log(f"region {r.id}: {job.first_failure}; its trials run again", level="warning",
                              region=r.id)
                self._submit(job, avoid=(job.where or {}).get("node_id"))
                job.where = None
        if item["default_sha"] != _sha(ks.source):
            return None, "the worker generated a different default kernel (its copy of the program differs)"
        item["attempts"], item["retried_after"] = job.attempt, job.first_failure
        return item, None

    def _where(self, res: dict) -> str:
        gpu = f", {res['gpu_name']}" if res.get("gpu_name") else ""
        again = f", attempt {res['attempts']} after {res['retried_after']}" if res.get("retried_after") else ""
        return f"on {res['host']} (pid {res['pid']}{gpu}{again})"

    def compiled(self, agent, r, ks) -> int:
        """No GPU: how many of region r's variants the worker compiled (the loop's _compile_variants)."""
        res, lost = self._result(r, ks)
        if lost:
            agent.tune_notes[r.id] = f"its tuning variants were not compiled: {lost}"
            agent.ev.log(f"region {r.id}: {agent.tune_notes[r.id]}", level="warning", region=r.id)
            return 0
        for t in res["trials"]:
            if not t["ok"]:
                agent.ev.log(f"region {r.id}: tuning variant {t['params']} does not build: {t['reason']}",
                             level="warning", region=r.id)
        n = sum(t["ok"] for t in res["trials"])
        agent.ev.log(f"region {r.id}: {n} tuning variant(s) compiled {self._where(res)}", region=r.id,
                     host=res["host"], pid=res["pid"], attempts=res["attempts"])
        return n

    def region(self, agent, r, ks, ins, best, out):
        """GPU: region r's trials from its worker; the one faster than the default there is verified and
        timed again here and kept when it beats the default here too. Returns the loop's `best`."""
        res, lost = self._result(r, ks)
        if lost:
            agent.tune_notes[r.id] = f"its tuning trials were lost ({lost}); default parameters kept"
            agent.ev.log(f"region {r.id}: {agent.tune_notes[r.id]}", level="warning", region=r.id)
            return best
        agent.ev.log(f"region {r.id}: {len(res['trials'])} trial(s) {self._where(res)}, the default "
                     f"{res['default_ms'] * 1e3:.1f} us there", region=r.id, host=res["host"], pid=res["pid"],
                     attempts=res["attempts"])
        faster = [t for t in res["trials"] if t["ok"] and t["ms"] < res["default_ms"]]
        pick = min(faster, key=lambda t: t["ms"]) if faster else None
        for t in res["trials"]:
            variant = t.pop("variant")
            rec = {**t, "host": res["host"], "best": False}
            if t is pick:      # verified and timed again on the driver's GPU, beside the default's time
                mine, cand = agent._trial(r, ks.name, t["trial"], variant, ins)
                rec["driver_ms"] = mine.get("ms")
                if cand is not None and cand[0] < best[0]:
                    best, rec["best"] = cand, True
                elif not mine["ok"]:
                    rec["driver_reason"] = mine.get("reason")
            out.trials.append(rec)
            agent.ev.emit("tune-step", region=r.id, **rec)
        return best

    def cancel(self) -> None:
        for job in self.jobs.values():
            with contextlib.suppress(Exception):
                self.ray.cancel(job.gen, force=True)
        self.jobs.clear()


@contextlib.contextmanager
def ray_tuning(address: str | None, kernel_cache: str | None):
    """A RayTuner on the cluster at `address` for the block (None without --ray); its tasks are
    cancelled when the block ends, by Ctrl+C or otherwise. The driver compiles through the same
    kernel cache as its workers (--kernel-cache; with `local` the driver's own)."""
    if not address:
        yield None
        return
    from ..compiler import cache_dir
    from ..profile.timing import TIMING_LOCK_ENV
    saved = {k: os.environ.get(k) for k in ("STITCHCUDA_CACHE", TIMING_LOCK_ENV)}
    if kernel_cache:
        os.environ["STITCHCUDA_CACHE"] = kernel_cache = os.path.abspath(kernel_cache)
    elif address == "local":
        kernel_cache = str(cache_dir().parent)      # the driver's own cache: this machine's workers share it
    lock = None
    with tempfile.NamedTemporaryFile(prefix="stitchcuda-gpu-", suffix=".lock") as f:
        if not saved[TIMING_LOCK_ENV]:
            os.environ[TIMING_LOCK_ENV] = f.name       # a worker on this host never times beside the driver
        lock = (socket.gethostname(), os.environ[TIMING_LOCK_ENV])
        try:
            with cluster(address) as ray:
                tuner = RayTuner(ray, kernel_cache, lock)
                try:
                    yield tuner
                finally:
                    tuner.cancel()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
