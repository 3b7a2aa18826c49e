"""The agent loop: rewrite -> plan -> for each region generate, compile, verify, time, tune, decide ->
the end-to-end program (one stream, CUDA graph) verified and timed against torch.

Every step is an event (agent.events); every region's outcome is written into the region itself
(`measured_ms`, `source`, `schedule["agent"]`, a decision-log entry), so the saved program file
explains what was kept and why. Without a GPU the loop stops after compiling every kernel to sm_90.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..codegen import CodegenError, generate_kernel
from ..compiler import DEFAULT_ARCH, CompileError, compile_kernel
from ..errors import StitchError
from ..ir import Program
from ..runtime.split_tf32 import TF32X3, TF32X3_CAT, describe_library_call, library_precision, run_library_node
from .attention_form import describe_form, exact_form, form_of, library_note, note_kept_form
from .region_kinds import without_kernel
from .events import EventEmitter
from .gemm_form import compiled_words as gemm_compiled_words, keep as gemm_keep, lone_words, runs_own
from .gemm_form import kept_words as gemm_kept_words, trial_words as gemm_trial_words
from .phases import phase
from .split_lost import split_lost, worth_splitting
from .tune import tune_space
from .tune_budget import worth_tuning
from .verdict import torch_path, views_copied

# where the loop puts tensors on a GPU run; tests of the GPU path's logic on a CPU machine set "cpu"
TENSOR_DEVICE = "cuda"
NO_GPU_LINE = "no GPU is present: kernels were generated and compiled for {arch}; verification and timing need a CUDA GPU"


@dataclass
class RegionOutcome:
    region: str
    status: str                    # fused | fallback | compiled (no GPU) | library | view
    reason: str = ""
    kernel: str | None = None
    source_path: str | None = None
    params: dict = field(default_factory=dict)
    fused_ms: float | None = None
    unfused_ms: float | None = None
    attribution: dict = field(default_factory=dict)
    trials: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class OptimizeResult:
    program: Program
    outcomes: list[RegionOutcome]
    gpu: bool
    status: str                    # done | no-gpu
    profile: dict = field(default_factory=dict)
    executable: object | None = None
    out_dir: str | None = None

    @property
    def fused(self) -> list[RegionOutcome]:
        return [o for o in self.outcomes if o.status == "fused"]

    @property
    def writer(self) -> dict | None:
        """The model-driven writer's summary (WriterRun.summary) when one ran."""
        return self.profile.get("writer")


def kernel_name(program: Program, rid: str) -> str:
    base = re.sub(r"\W+", "_", program.name or "program").strip("_") or "program"
    if base[0].isdigit():
        base = "p_" + base
    return f"{base[:40]}_{rid}"


def _first(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _Agent:
    def __init__(self, program, emit: EventEmitter, out_dir, gpu, draws, tune, tune_trials, trials, arch,
                 time_regions=True):
        self.program, self.ev, self.out_dir = program, emit, out_dir
        self.time_regions = time_regions
        self.ref = None   # refcache.ReferenceCache (GPU runs)
        self.gpu, self.draws, self.tune, self.tune_trials, self.trials = gpu, draws, tune, tune_trials, trials
        self.arch = arch
        self.hw: dict = {}
        self.kernels: dict = {}   # region id -> our last generated KernelSource (the tuned best on a GPU)
        self.prefetch = None      # agent.prefetch.KernelPrefetch: kernels generated and compiling ahead
        self.remote_tune = None   # cluster.ray_tune.RayTuner: the tuning trials run on a Ray cluster
        self.tune_notes: dict[str, str] = {}   # region id -> why its trials were lost (appended to its reason)
        from .shared_regions import SharedRegions
        self.shared = SharedRegions()   # regions of one kernel and shapes: verified, tuned and timed once

    # --- per region --------------------------------------------------------------------------
    def region(self, r) -> tuple[RegionOutcome, object | None]:
        """(outcome, (nodes, KernelSource, LoadedKernel) when kept)."""
        p = self.program
        name = kernel_name(p, r.id)
        out = RegionOutcome(r.id, "fallback", kernel=name)
        kind = without_kernel(p, r.nodes)
        if kind is not None:
            what, node = kind
            views = "; the views around it only relabel memory" if len(r.nodes) > 1 else ""
            if what == "view":
                out.status, out.reason = "view", "only relabels memory (a view): no kernel runs"
            elif what == "strided_view":
                out.status = "view"
                out.reason = (f"{node.name} ({node.op}) runs through torch as a strided view: only library calls "
                              f"read it, and cuBLAS / cuDNN take it as it is; no kernel runs")
            elif what == "library":
                out.status = "library"
                out.reason = (f"{node.name} ({node.op}) alone runs through cuBLAS/cuDNN via torch "
                              f"({describe_library_call(p, node.id)}){library_note(p, node)}{views}")
            else:
                out.status = "library"
                out.reason = (f"{node.name} ({node.op}) runs through cuDNN via torch (recurrent nets have no "
                              f"generated cell){views}")
            return self._finish(r, out), None
        try:
            t0 = time.perf_counter()
            ks = self._generate(r, name)
            self.ev.emit("codegen", region=r.id, kernel=name, kind=ks.kind, schedule=ks.schedule,
                         params=ks.params, lines=ks.source.count("\n") + 1, bytes=ks.bytes_moved,
                         library_nodes=ks.library_nodes, seconds=time.perf_counter() - t0)
        except CodegenError as exc:
            out.reason = f"not generated: {exc}"
            return self._finish(r, out), None
        except Exception as exc:   # a generator bug must not stop the other regions
            out.reason = f"not generated (generator error {type(exc).__name__}: {_first(exc)})"
            return self._finish(r, out), None
        r.source = ks.source
        self.kernels[r.id] = ks
        out.source_path = self._write_source(ks)
        try:
            c = self._compile(r, ks)
        except CompileError as exc:
            out.reason = f"compile failed: {exc}"
            return self._finish(r, out), None
        out.attribution = {"registers": c.registers, "spill_stores": c.spill_stores, "spill_loads": c.spill_loads,
                           "stack_bytes": c.stack_bytes}
        if not self.gpu:
            out.status, out.reason = "compiled", f"compiled for {c.arch}; not verified or timed (no GPU)"
            if self.tune:   # the tuning variants must compile too (and this fills the cache a GPU run reuses)
                with phase("tune"):
                    n = (self._compile_variants(r, ks) if self.remote_tune is None
                         else self.remote_tune.compiled(self, r, ks))
                if n:
                    out.reason += f"; {n} tuning variant(s) compiled{gemm_compiled_words(self.program, ks)}"
            return self._finish(r, out), None
        return self.shared.run(self, r, out, ks, c)     # self._on_gpu, or the outcome of the same kernel

    def _compile_variants(self, r, ks) -> int:
        n = 0
        for params in tune_space(ks, limit=self.tune_trials):
            try:
                compile_kernel(self._generate(r, ks.name, params), arch=self.arch)
                n += 1
            except StitchError as exc:
                self.ev.log(f"region {r.id}: tuning variant {params} does not build: {exc}", level="warning",
                            region=r.id)
        return n

    def _generate(self, r, name, params=None):
        """Region r's kernel: the one agent.prefetch generated ahead (and is compiling), else now."""
        pre = self.prefetch.take(r, name, params) if self.prefetch is not None else None
        return pre or generate_kernel(self.program, r.nodes, name=name, kind=r.kind, params=params)

    def _compile(self, r, ks):
        with phase("compile"):    # the event's NVRTC seconds (emitted inside), plus the cache look-up
            c = compile_kernel(ks, arch=self.arch)
            self.ev.emit("compile", region=r.id, kernel=ks.name, arch=c.arch, seconds=c.seconds, cached=c.cached,
                         registers=c.registers, spill_stores=c.spill_stores, spill_loads=c.spill_loads)
        return c

    def _write_source(self, ks, filename: str | None = None) -> str | None:
        if not self.out_dir:
            return None
        path = Path(self.out_dir) / "kernels" / (filename or ks.filename)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(ks.source)
        return str(path.relative_to(self.out_dir))

    def _region_tensors(self, ks, io_inputs):
        """Random GPU inputs of a region for timing (values do not change a kernel's time). Drawing them
        is GPU work: never during another problem's measurement (bench --jobs)."""
        import torch
        from ..profile.timing import gpu_work
        from ..reference import parameter_tensors
        dev = TENSOR_DEVICE
        with gpu_work():
            params = parameter_tensors(self.program, dev) if not hasattr(self, "_params") else self._params
            self._params = params
            gen = torch.Generator(device=dev).manual_seed(0)
            ins = []
            for v in io_inputs:
                if v in params:
                    ins.append(params[v])
                    continue
                val = self.program.values[v]
                shape, dtype = tuple(val.shape), getattr(torch, val.dtype)
                if val.dtype == "bool":
                    ins.append(torch.rand(shape, device=dev, generator=gen) < 0.5)
                elif val.dtype.startswith("int"):
                    ins.append(torch.zeros(shape, dtype=dtype, device=dev))
                else:
                    ins.append(torch.randn(shape, device=dev, generator=gen, dtype=dtype))
        return ins

    def _runner(self, r, ks, loaded):
        from ..codegen import region_io
        from ..runtime.region import RegionRunner
        io = region_io(self.program, r.nodes)
        return RegionRunner(self.program, ks.name, io.nodes, io.inputs, io.outputs, kernel=ks, loaded=loaded)

    def _verify(self, r, runner, draws, what):
        from .refcache import verify_candidate
        with phase("verify"):
            res = verify_candidate(self.program, self.ref, runner.inputs, runner.outputs, lambda ins: runner(ins),
                                   draws=draws, device=TENSOR_DEVICE)
        self.ev.emit("verify", scope="region", region=r.id, kernel=runner.name, ok=res.ok, draws=res.draws,
                     max_abs_err=res.max_abs_err, reason=res.reason, candidate=what)
        return res

    def _fused_fn(self, runner, ins):
        """The region as the end-to-end program runs it: library call(s) through torch, then the
        kernel launched with raw pointers (capturable)."""
        import torch
        from ..program_runtime.executable import launchable, raw_launch
        ks, lk, prog = runner.kernel, runner.loaded, self.program
        outs = [torch.empty(s, dtype=getattr(torch, d), device=TENSOR_DEVICE) for s, d in lk.specs]

        def fn():
            env = dict(zip(runner.inputs, ins))
            for nid in ks.library_nodes:
                run_library_node(prog, nid, env)
            raw_launch(lk, [launchable(env[v], ks.align) for v in ks.inputs], outs)
        return fn

    def _time(self, runner, ins):
        """Median ms of the fused region, replayed in a CUDA graph as the end-to-end program runs it."""
        from ..profile.timing import time_in_graph
        return time_in_graph(self._fused_fn(runner, ins), trials=self.trials)[0]

    def _unfused_ms(self, runner, ins) -> tuple[float, bool]:
        """(median ms, whether views were copied) of the region's ops one by one, replayed in a CUDA
        graph, with the copies of the views they leave (verdict.py: a free transpose is paid by its reader)."""
        import torch
        from ..profile.timing import time_in_graph
        with torch.no_grad():
            copied = views_copied(runner.run_unfused(ins))
            return time_in_graph(lambda: torch_path(runner, ins), trials=self.trials)[0].median_ms, copied

    def _on_gpu(self, r, out, ks, c):
        from ..profile.attribution import attribute
        from ..runtime.launch import load_kernel
        try:
            with phase("load"):
                loaded = load_kernel(ks, self.program, c)
        except StitchError as exc:
            out.reason = f"load failed: {exc}"
            return self._finish(r, out), None
        runner = self._runner(r, ks, loaded)
        res = self._verify(r, runner, self.draws, "default")
        split = [n for n in ks.library_nodes if n in library_precision(self.program)]
        if not res.ok and split:   # the split-TF32 library call may be what differs: fp32 it, then again
            for n in split:
                del self.program.metadata["library_precision"][n]
                self.ev.emit("precision", node=n, op=self.program.nodes[n].op, chosen="fp32",
                             reason=f"region {r.id} failed verification with split TF32 ({res.reason})")
            res = self._verify(r, runner, self.draws, "library calls in fp32")
        if not res.ok and form_of(ks) == "3xtf32":   # our attention kernel: its exact fp32 form instead
            try:
                ks, loaded, runner, res = exact_form(self, r, ks, res)
                r.source, self.kernels[r.id] = ks.source, ks
                out.source_path = self._write_source(ks)
            except StitchError as exc:
                out.reason = f"verification failed with split TF32 and the fp32 form does not build: {exc}"
                return self._finish(r, out), None
        if not res.ok:
            out.reason = f"verification failed: {res.reason}"
            return self._finish(r, out), None
        if not self.time_regions:
            out.status = "fused"
            out.reason = f"verified on {self.draws} draws (not timed: region timing was turned off)"
            return self._finish(r, out), (list(r.nodes), ks, loaded)
        ins = self._region_tensors(ks, runner.inputs)
        try:
            with phase("time_regions"):
                best_t = self._time(runner, ins)
        except Exception as exc:
            out.reason = f"timing failed: {type(exc).__name__}: {_first(exc)}"
            return self._finish(r, out), None
        best = first = (best_t.median_ms, ks, loaded, runner, dict(ks.params))
        out.trials.append({"trial": 0, "params": ks.params, "ms": best_t.median_ms, "ok": True})
        self.ev.emit("tune-step", region=r.id, trial=0, params=ks.params, ok=True, ms=best_t.median_ms,
                     best=True, schedule=ks.schedule)
        if self.tune and self.remote_tune is not None:   # the trials ran on a cluster's workers (cluster/ray_tune.py)
            with phase("tune"):
                best = self.remote_tune.region(self, r, ks, ins, best, out)
        elif self.tune and worth_tuning(self, r, out):     # regions under 1% of the program keep their defaults
            with phase("tune"):   # the trials; their quick verifications count as verify
                sm = int(self.hw.get("sm_count") or 132)
                for i, params in enumerate(tune_space(ks, sm_count=sm, limit=self.tune_trials), 1):
                    rec, cand = self._trial(r, ks.name, i, params, ins)
                    if cand is not None and cand[0] < best[0]:
                        best = cand
                        rec["best"] = True
                    out.trials.append(rec)
                    rec.setdefault("best", False)
                    self.ev.emit("tune-step", region=r.id, **rec)
        ms, ks, loaded, runner, params = best
        if ks.source != r.source:
            res = self._verify(r, runner, self.draws, "tuned best")
            if not res.ok and runs_own(ks):   # the default it was timed against (verified on every draw)
                out.trials.append({"trial": "full", "params": ks.params, "ok": False,
                                   "reason": f"failed full verification: {res.reason}"})
                ms, ks, loaded, runner, params = best = first
            elif not res.ok:     # never keep a variant that only passed the quick check
                out.reason = f"the tuned kernel failed full verification: {res.reason}"
                return self._finish(r, out), None
            r.source = ks.source
            self.kernels[r.id] = ks
            out.source_path = self._write_source(ks)
        try:
            with phase("time_regions"):
                unfused, copied = self._unfused_ms(runner, ins)
        except Exception as exc:
            out.reason = f"timing the unfused ops failed: {type(exc).__name__}: {_first(exc)}"
            return self._finish(r, out), None
        out.fused_ms, out.unfused_ms, out.params = ms, unfused, params
        res_attr = loaded.attribution()
        out.attribution = attribute(ms, ks.bytes_moved, ks.flops, self.hw.get("copy_bandwidth_gbs") or 4200.0,
                                    resources=res_attr)
        self.ev.emit("profile", scope="region", region=r.id, kernel=ks.name, ms=ms, unfused_ms=unfused,
                     **{k: v for k, v in out.attribution.items() if k != "ms"})
        if ms < unfused:
            out.status = "fused"
            out.reason = (f"verified on {self.draws} draws and {unfused / ms:.2f}x faster than its "
                          f"{len(r.nodes)} unfused op(s) ({ms * 1e3:.1f} us vs {unfused * 1e3:.1f} us, "
                          f"both replayed in a CUDA graph{'; the ops leave views, so their copy is counted' if copied else ''})")
            for nid in ks.library_nodes:
                out.reason += f"; its {self.program.nodes[nid].op} runs as {describe_library_call(self.program, nid)}"
            out.reason += note_kept_form(self, r, ks)
            if runs_own(ks):
                gemm_keep(self, r, ks)
            if runs_own(first[1]):     # a matmul or convolution alone: our forms were its only forms
                out.reason += lone_words(self.program, ks, True, ms, unfused)
            else:
                out.reason += gemm_kept_words(ks, out.trials) if runs_own(ks) else gemm_trial_words(out.trials)
            return self._finish(r, out), (list(r.nodes), ks, loaded)
        if runs_own(first[1]):     # a matmul or convolution alone: the library call stays, as without our kernel
            out.status, out.reason = "library", lone_words(self.program, ks, False, ms, unfused)
            return self._finish(r, out), None
        out.reason = (f"correct but not faster than its unfused ops ({ms * 1e3:.1f} us vs {unfused * 1e3:.1f} us"
                      f"{', the copy of their view outputs included' if copied else ''}); the ops run through torch"
                      f"{' (its SDPA as torch fused attention; ours was ' + describe_form(ks) + ')' if form_of(ks) else ''}"
                      f"{gemm_trial_words(out.trials)}")
        return self._finish(r, out), None

    def _trial(self, r, name, i, params, ins):
        """Tuning trial i of region r: generate, compile, load, verify on one draw, time on `ins`.
        (its record, (ms, KernelSource, LoadedKernel, runner, params) when it verified, else None)."""
        from ..runtime.launch import load_kernel
        rec = {"trial": i, "params": params, "ok": False}
        try:
            k2 = self._generate(r, name, params)
            l2 = load_kernel(k2, self.program, compile_kernel(k2, arch=self.arch))
            run2 = self._runner(r, k2, l2)
            quick = self._verify(r, run2, 1, f"trial {i}")
            if not quick.ok:
                rec["reason"] = quick.reason
                return rec, None
            t2 = self._time(run2, ins)
            rec.update(ok=True, ms=t2.median_ms, params=k2.params, schedule=k2.schedule)
            return rec, (t2.median_ms, k2, l2, run2, dict(k2.params))
        except Exception as exc:   # a variant that fails to build, load or run is one rejected trial
            rec["reason"] = f"{type(exc).__name__}: {_first(exc)}"
            return rec, None

    # --- the model-driven writer (agent_core.writer, docs/WRITER.md) ---------------------------
    def write(self, r, out: RegionOutcome, run) -> object | None:
        """Ask the model for region r after our outcome `out`; when its kernel is kept, `out` becomes
        fused with it and the (nodes, KernelSource, LoadedKernel) the end-to-end program runs is returned."""
        ours = self.kernels.get(r.id)
        if ours is not None and out.reason.startswith(("verification failed", "the tuned kernel failed")):
            ours = None        # a wrong kernel is no starting point
        ours_ms, unfused = out.fused_ms, out.unfused_ms   # ours measured even when it lost to the ops
        if self.gpu and ours_ms is None and unfused is None:
            unfused = self._time_region_unfused(r, out)
        nbytes = self._region_bytes(r, ours)
        bw = self.hw.get("copy_bandwidth_gbs") or 4200.0
        measured: dict = {}
        res = run.region(self.program, r, ours=ours, ours_ms=ours_ms, unfused_ms=unfused,
                         floor_ms=nbytes / (bw * 1e6), attribution=out.attribution,
                         hardware=self.hw,     # {} without a GPU: the prompt then says an H200 is assumed
                         timer=(lambda ks: self._time_proposal(r, ks, measured)) if self.gpu else None,
                         name=kernel_name(self.program, r.id), draws=min(self.draws, 3))
        if not res.kept:
            r.note("writer", "not kept", f"{run.config.model}: {res.reason}")
            return None
        ks = res.kernel
        loaded, runner = measured[ks.source]
        check = self._verify(r, runner, self.draws, f"model kernel (round {res.round})")
        if not check.ok:     # checked in the child already; this is how ours is verified
            r.note("writer", "rejected", f"{run.config.model} round {res.round}: verification in the run failed: "
                                         f"{check.reason}")
            return None
        from ..profile.attribution import attribute
        from ..writer.loop import us
        r.source = ks.source
        out.status, out.kernel, out.params = "fused", ks.name, {}
        out.source_path = self._write_source(ks, f"{ks.name}.model.cu")   # ours stays in {name}.cu
        out.fused_ms, out.unfused_ms = res.ms, unfused
        out.attribution = attribute(res.ms, nbytes, (ours.flops if ours else 0), bw, resources=loaded.attribution())
        out.reason = f"{res.reason}; verified again on {self.draws} draws in the run"
        self._finish(r, out)     # the region's new outcome (agent entry, log event), then the writer's entry
        r.note("writer", "kept", f"model kernel kept (round {res.round}): {us(res.ms)} vs {res.against} "
                                 f"{us(res.ours_ms)}")
        return (list(r.nodes), ks, loaded)

    def _region_bytes(self, r, ks) -> int:
        """The region's floor bytes: our kernel's count, else its inputs read once and outputs written."""
        if ks is not None and ks.bytes_moved:
            return ks.bytes_moved
        from ..codegen import region_io
        io = region_io(self.program, r.nodes)
        return sum(self.program.values[v].nbytes for v in io.inputs + io.outputs)

    def _time_region_unfused(self, r, out) -> float | None:
        """What a proposal must beat when we timed nothing (ours not generated or not verified)."""
        from ..codegen import region_io
        from ..runtime.region import RegionRunner
        try:
            io = region_io(self.program, r.nodes)
            runner = RegionRunner(self.program, r.id, io.nodes, io.inputs, io.outputs)
            ms, _ = self._unfused_ms(runner, self._region_tensors(None, runner.inputs))
        except Exception as exc:
            self.ev.log(f"region {r.id}: timing the unfused ops for the writer failed: {type(exc).__name__}: "
                        f"{_first(exc)}", level="warning", region=r.id)
            return None
        out.unfused_ms = ms
        return ms

    def _time_proposal(self, r, ks, measured: dict) -> float:
        """A proposal timed exactly as ours is (the writer calls this only after the gate's checks
        passed in the executor's child process): loaded here, launched in a CUDA graph on the same inputs."""
        from ..runtime.launch import load_kernel
        loaded = load_kernel(ks, self.program, compile_kernel(ks, arch=self.arch))
        runner = self._runner(r, ks, loaded)
        ms = self._time(runner, self._region_tensors(ks, runner.inputs)).median_ms
        measured[ks.source] = (loaded, runner)
        return ms

    def _finish(self, r, out: RegionOutcome) -> RegionOutcome:
        if r.id in self.tune_notes:
            out.reason += f"; {self.tune_notes.pop(r.id)}"
        if out.fused_ms is not None:
            r.measured_ms = out.fused_ms
        r.schedule["agent"] = {"status": out.status, "reason": out.reason, "kernel": out.kernel,
                               "source_path": out.source_path, "params": out.params, "fused_ms": out.fused_ms,
                               "unfused_ms": out.unfused_ms}
        r.note("agent", "kept" if out.status == "fused" else out.status, out.reason)
        if out.status in ("fallback",):
            self.ev.emit("fallback", region=r.id, reason=out.reason, kernel=out.kernel)
        else:
            self.ev.log(f"region {r.id}: {out.status}: {out.reason}", region=r.id, status=out.status)
        return out


def optimize(program: Program, *, out_dir=None, device=None, emit: EventEmitter | None = None, tune: bool = True,
             draws: int = 5, tune_trials: int = 6, trials: int = 20, rewrite: bool = True, baselines: bool = True,
             baseline_fn=None, compile_modes=("default", "reduce-overhead"), compile_budget_s: float = 120.0,
             graph: bool = True, time_regions: bool = True, split_tf32: bool = True,
             final_dir=None, writer=None, cancel=None, writer_sanitize: bool = False, tuner=None) -> OptimizeResult:
    """Optimize `program` (left untouched: the result holds the rewritten, planned copy).

    out_dir: where the kernels, program.json and profile.json are written; final_dir: where the caller
    moves out_dir when the run succeeds (the commands write into a fresh folder, agent_core.output_dir),
    named by the done event (default out_dir).

    device: None = the GPU when one is usable, "cpu" = plan, generate and compile only (sm_90).
    split_tf32: let matmuls and convolutions run as split TF32 (or a timed cuDNN algorithm) where that
    is measured faster (agent.precision, runtime.split_tf32; kept only where it verifies within the
    program's tolerance, verify.tolerance), and in the lower precisions the program allows
    (runtime.low_precision).
    baseline_fn: (fn, inputs) to time as torch eager / torch.compile (default: the program op by op).
    writer: a writer.config.WriterConfig: after our outcome, a model proposes kernels for each eligible
    region (docs/WRITER.md); None = off, nothing changes. cancel() -> True stops the writer at once;
    writer_sanitize: the gate also runs each proposal under compute-sanitizer memcheck (GPU).
    tuner: a cluster.ray_tune.RayTuner: each region's tuning trials run as a task on a Ray cluster's
    workers (docs/CLUSTER.md); None = here, one after another."""
    from ..planner import apply_plan, plan_program
    from ..profile.hardware import no_gpu_reason
    from ..runtime.low_precision import allowed
    from ..verify import tolerance
    (atol, rtol), lower = tolerance(program), allowed(program)    # a malformed setting fails here, before any work
    emit = emit or EventEmitter()
    if "tolerance" in program.metadata or lower:
        emit.log(f"verified within atol {atol:g}, rtol {rtol:g} (the program's tolerance)"
                 + (f"; lower precisions allowed: {', '.join(lower)}" if lower else ""),
                 tolerance={"atol": atol, "rtol": rtol}, allow_precision=lower)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    why_not = "device='cpu' was asked for" if device == "cpu" else no_gpu_reason()
    gpu = why_not is None
    if gpu:
        from ..profile.baselines import strict_fp32
        strict_fp32()     # before any reference runs on the GPU: TF32 off everywhere
    prog = program
    rewritten = False
    rewrites_skipped = None     # why, when they were: a program planned as written may be far slower
    big = too_big_to_check(program)
    if rewrite and big and not gpu:
        rewrites_skipped = f"too big to check on the CPU ({big})"
        emit.log(f"rewrites skipped: checking them runs the reference twice on the CPU, and this program "
                 f"({big}) would take too long; it is planned as it is", level="warning")
        rewrite = False
    if rewrite:
        from ..rewrites import rewrite_program
        # each rewrite is checked on reference values; a large program's are computed on the GPU
        check_on = TENSOR_DEVICE if big else "cpu"
        try:
            from ..profile.timing import gpu_work
            on_gpu = gpu_work() if check_on != "cpu" else contextlib.nullcontext()   # GPU reference runs
            with phase("rewrite"), on_gpu:
                rr = rewrite_program(program, device=check_on)
            prog = rr.program
            rewritten = bool(rr.fired)
            for e in rr.fired:
                emit.emit("rewrite", rule=e["rule"], node=e["node"], message=e["message"], kept=True,
                          checked_on=check_on)
            for e in rr.refused:
                emit.emit("rewrite", rule=e["rule"], node=e["node"], message=e.get("error") or e["message"], kept=False)
        except StitchError as exc:
            rewrites_skipped = f"{type(exc).__name__}: {exc}"
            emit.log(f"rewrites skipped: {exc}", level="warning")
    else:
        from ..rewrites import clone_program
        prog = clone_program(program)
    # the memory budget is eager's peak, and eager runs the program as it came, not as rewritten
    from ..program_runtime import eager_peak_estimate
    prog.metadata["eager_peak_estimate_bytes"] = eager_peak_estimate(program)
    plan = plan_program(prog)
    apply_plan(prog, plan)
    emit.emit("plan", program=prog.name, nodes=len(prog.nodes), regions=len(plan.active), kernels=plan.kernels,
              unfused_ms=plan.estimate.unfused_ms, planned_ms=plan.estimate.planned_ms,
              floor_ms=plan.estimate.floor_ms, seconds=plan.seconds)
    for r in plan.active:
        emit.emit("region-proposed", region=r.id, kind=r.kind, nodes=list(r.nodes), reason=r.reason,
                  est_before_ms=r.est_before_ms, est_after_ms=r.est_after_ms, schedule=r.schedule)
    arch = None if gpu else DEFAULT_ARCH
    agent = _Agent(prog, emit, out_dir, gpu, draws, tune, tune_trials, trials, arch, time_regions)
    agent.planned_ms = plan.estimate.planned_ms     # what a region's share of the program is taken of
    profile: dict = {"program": prog.name, "gpu": gpu}
    if why_not:
        profile["no_gpu"] = why_not
    if rewrites_skipped:
        profile["rewrites_skipped"] = rewrites_skipped
    if gpu:
        from .refcache import ReferenceCache
        keep: set[str] = set()
        from ..codegen import region_io
        for r in plan.active:
            try:
                io = region_io(prog, r.nodes)
                keep.update(io.inputs, io.outputs)
            except StitchError:
                pass
        # the end-to-end check compares with the program as given, not as rewritten
        agent.ref = ReferenceCache(prog, keep, device=ReferenceCache.choose_device(prog, True),
                                   original=program if rewritten else None)
        from ..profile.baselines import strict_fp32
        from ..profile.hardware import hardware_snapshot
        strict_fp32()
        agent.hw = hardware_snapshot()
        profile["hardware"] = agent.hw
        emit.log(f"GPU: {agent.hw['name']}, {agent.hw['sm_count']} SMs, copy bandwidth "
                 f"{agent.hw['copy_bandwidth_gbs']:.0f} GB/s", hardware=agent.hw)
        prog.metadata.pop("library_precision", None)
        if split_tf32:   # before the regions: their library calls are verified and timed as they will run
            from .precision_share import choose_shared_precision as choose_library_precision   # one per signature
            with phase("precision"):
                from ..program_runtime.memory_plan import split_room
                from ..program_runtime.steps import planned_steps
                from .precision import fit_to_memory
                planned = planned_steps(prog, plan.active)
                room = split_room(prog, planned)     # forms that cannot fit are not timed
                choose_library_precision(prog, lambda vids: agent._region_tensors(None, vids), emit, trials, room=room)
                fit_to_memory(prog, planned, emit)
    if tune and tuner is not None:     # the trials' tasks start now, on the program as planned and precision-chosen
        agent.remote_tune = tuner.start(prog, plan.active, lambda r: kernel_name(prog, r.id), gpu=gpu,
                                        sm_count=int(agent.hw.get("sm_count") or 132), tune_trials=tune_trials,
                                        trials=trials, emit=emit)
    from .prefetch import KernelPrefetch    # every region's kernels generated, compiled in parallel
    wrun = _writer_run(writer, emit, gpu, cancel, writer_sanitize)
    outcomes, fused = [], {}
    with prog.frozen():       # generating, verifying and timing regions never edits the graph
        with phase("generate"):   # the compiles it starts are waited for in the loop's compile phase
            agent.prefetch = KernelPrefetch(prog, arch=arch, tune=tune and agent.remote_tune is None,
                                            tune_trials=tune_trials,
                                            sm_count=int(agent.hw.get("sm_count") or 132)).start(
                plan.active, lambda r: kernel_name(prog, r.id))
        def run(r) -> None:
            try:
                o, keep = agent.region(r)
            except Exception as exc:  # one region's failure is that region's fallback, never the run's
                o = agent._finish(r, RegionOutcome(r.id, "fallback",
                                                   f"agent error {type(exc).__name__}: {_first(exc)}"))
                keep = None
            if wrun is not None and wrun.wants(r.id, o.status):
                with phase("writer"):
                    keep = agent.write(r, o, wrun) or keep
            outcomes.append(o)
            if keep is not None:
                fused[r.id] = keep
        for r in plan.active:
            run(r)
        lost = [(r, o) for r, o in zip(plan.active, outcomes) if worth_splitting(agent, r, o)]
        if lost:      # a region that verified but lost: its parts may each still win (split_lost.py)
            split_lost(agent, prog, lost, run)
    profile["regions"] = [o.to_dict() for o in outcomes]
    if gpu:
        profile["shared_regions"] = agent.shared.summary()
    if wrun is not None:
        profile["writer"] = wrun.summary()
    result = OptimizeResult(prog, outcomes, gpu, "done" if gpu else "no-gpu", profile, out_dir=out_dir)
    if gpu:
        try:
            _end_to_end(result, fused, emit, agent.ref, draws=draws, trials=trials, graph=graph,
                        baselines=baselines, baseline_fn=baseline_fn, compile_modes=compile_modes,
                        compile_budget_s=compile_budget_s, rewritten=rewritten)
        except RewriteMismatch as exc:
            emit.emit("error", message=f"{exc}; optimizing the program again without rewrites")
            return optimize(program, out_dir=out_dir, device=device, emit=emit, tune=tune, draws=draws,
                            tune_trials=tune_trials, trials=trials, rewrite=False, baselines=baselines,
                            baseline_fn=baseline_fn, compile_modes=compile_modes,
                            compile_budget_s=compile_budget_s, graph=graph, time_regions=time_regions,
                            split_tf32=split_tf32, final_dir=final_dir, writer=wrun, cancel=cancel, tuner=tuner)
    else:
        emit.log(NO_GPU_LINE.format(arch=DEFAULT_ARCH) + f" ({why_not})", level="warning", no_gpu=True)
    prog.profile = _json_safe(profile)
    if out_dir:
        _write_outputs(result)
    counts = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    emit.emit("done", status=result.status, regions=len(outcomes), outcomes=counts,
              ours_ms=profile.get("end_to_end", {}).get("ms"), out_dir=str(final_dir or out_dir) if out_dir else None)
    return result


def _writer_run(writer, emit, gpu: bool, cancel, sanitize: bool):
    """The run's writer (agent_core.writer.loop.WriterRun) for a WriterConfig, or None when off; a
    WriterRun passed in (optimize again without rewrites) keeps its token budget."""
    if writer is None:
        return None
    from ..writer.loop import WriterRun
    return writer if isinstance(writer, WriterRun) else WriterRun(writer, emit, gpu=gpu, cancel=cancel,
                                                                  sanitize=sanitize)


# rewrites are checked on CPU reference runs (agent_core.rewrites.Checker, two draws, every value kept):
# beyond these sizes that costs more than a minute and several GB, so large programs skip them
REWRITE_MAX_FLOPS = 1e9
REWRITE_MAX_BYTES = 256 << 20


def too_big_to_check(program: Program) -> str | None:
    flops = sum(program.node_flops(n) for n in program.nodes)
    nbytes = sum(v.nbytes for v in program.values.values())
    if flops > REWRITE_MAX_FLOPS:
        return f"{flops / 1e9:.0f} GFLOP"
    if nbytes > REWRITE_MAX_BYTES:
        return f"{nbytes / 2**30:.1f} GiB of values"
    return None


class RewriteMismatch(StitchError):
    """The rewritten program, run op by op through torch, disagrees with the program as given."""


# whole-program verifications spent looking for the regions that break it before the rest fall back too
CULPRIT_VERIFIES = 12


def _without_culprits(result, fused, emit, ref, *, draws, graph, first):
    """The end-to-end program failed with every kept region: find the regions that cause it by bisection
    (a group that verifies is kept whole, one that fails is split until single regions are blamed), so
    one bad kernel does not send every other region back to torch. After CULPRIT_VERIFIES builds the
    regions not yet cleared fall back as well. Returns the executable and verification to go on with."""
    from ..program_runtime import build_executable
    prog = result.program
    outcome = {o.region: o for o in result.outcomes}
    kept: dict = {}
    spent = [0]

    def check(extra):
        with phase("build"):
            exe = build_executable(prog, {**kept, **extra}, graph=graph, device=TENSOR_DEVICE)
        with phase("verify"):
            res = exe.verify(draws, ref=ref)
        spent[0] += 1
        emit.emit("verify", scope="program", ok=res.ok, draws=res.draws, max_abs_err=res.max_abs_err,
                  reason=res.reason, regions=sorted(extra))
        return exe, res

    def blame(ids, why):
        for rid in ids:
            o = outcome.get(rid)
            if o is not None and o.status == "fused":
                o.status, o.reason = "fallback", why

    todo = [list(fused)]
    known_bad = {tuple(fused): first}
    while todo:
        ids = todo.pop(0)
        res = known_bad.get(tuple(ids))
        if res is None:
            if spent[0] >= CULPRIT_VERIFIES:
                blame(ids, f"the whole program failed verification with the generated kernels ({first.reason}) "
                           f"and this region was not cleared within {CULPRIT_VERIFIES} checks")
                continue
            _, res = check({r: fused[r] for r in ids})
            if res.ok:
                kept.update({r: fused[r] for r in ids})
                continue
        if len(ids) == 1:
            blame(ids, f"the whole program failed verification with it: {res.reason}")
            continue
        half = len(ids) // 2
        todo[:0] = [ids[:half], ids[half:]]
    exe, res = check({})
    return exe, res


def _end_to_end(result, fused, emit, ref, *, draws, trials, graph, baselines, baseline_fn, compile_modes,
                compile_budget_s, rewritten=False):
    from ..profile.attribution import attribute, effective_tflops
    from ..profile.timing import time_gpu
    from ..program_runtime import build_executable
    prog, profile = result.program, result.profile
    with phase("build"):
        exe = build_executable(prog, fused, graph=graph, device=TENSOR_DEVICE)
    with phase("verify"):
        res = exe.verify(draws, ref=ref)
    emit.emit("verify", scope="program", ok=res.ok, draws=res.draws, max_abs_err=res.max_abs_err, reason=res.reason)
    if not res.ok and (library_precision(prog) or prog.metadata.get("library_layout")):
        emit.emit("error", message=f"the end-to-end program with split-TF32 (or channels-last) library calls failed "
                                   f"verification ({res.reason}); every matmul and convolution runs in fp32 instead")
        prog.metadata["library_precision"] = {}
        prog.metadata["library_layout"] = {}
        profile["library_precision_fallback"] = res.reason
        with phase("build"):
            exe = build_executable(prog, fused, graph=graph, device=TENSOR_DEVICE)
        with phase("verify"):
            res = exe.verify(draws, ref=ref)
        emit.emit("verify", scope="program", ok=res.ok, draws=res.draws, max_abs_err=res.max_abs_err,
                  reason=res.reason)
    profile["library_precision"] = dict(library_precision(prog))
    if prog.metadata.get("library_precision_errors"):   # nodes only timed in fp32, and why
        profile["library_precision_errors"] = dict(prog.metadata["library_precision_errors"])
    profile["library_layout"] = dict(prog.metadata.get("library_layout") or {})
    if not res.ok and fused:
        emit.emit("error", message=f"the end-to-end program with generated kernels failed verification "
                                   f"({res.reason}); looking for the regions that cause it")
        exe, res = _without_culprits(result, fused, emit, ref, draws=draws, graph=graph, first=res)
    if not res.ok and rewritten:
        raise RewriteMismatch(f"the rewritten program does not match the original ({res.reason})")
    if exe.graph_error:
        emit.log(exe.graph_error, level="warning")
    timed_on = _baseline_inputs_into(exe, baseline_fn, emit)
    with phase("time_program"):
        t = time_gpu(exe.replay, trials=trials)
    bw = (profile.get("hardware") or {}).get("copy_bandwidth_gbs") or 4200.0
    nbytes = sum(prog.values[v].nbytes for v in prog.inputs) + sum(v.nbytes for v in prog.parameters()) + \
        sum(prog.values[v].nbytes for v in set(prog.outputs))
    flops = sum(prog.node_flops(n) for n in prog.nodes)
    from ..program_runtime.memory_plan import memory_summary
    from ..runtime.low_precision import FORMS as LOWER
    forms = library_precision(prog)
    split = sum(prog.node_flops(n) for n, f in forms.items() if f in (TF32X3, TF32X3_CAT))
    single = sum(prog.node_flops(n) for n, f in forms.items() if f in LOWER)
    e2e = attribute(t.median_ms, nbytes, flops, bw, tflops=effective_tflops(flops, split, single))
    e2e.update(correct=res.ok, verify=res.as_dict(), timing=t.to_dict(), timed_on=timed_on, **exe.summary(),
               memory=exe.memory.to_dict())
    profile["end_to_end"] = e2e
    emit.emit("profile", scope="program", ms=t.median_ms, floor_ms=e2e["floor_ms"], achieved_gbs=e2e["achieved_gbs"],
              launches=exe.launches, cuda_graph=exe.graph is not None, memory=memory_summary(e2e["memory"]))
    result.executable = exe
    if baselines:
        from ..profile.baselines import best_compile_ms, measure_baselines, program_callable
        try:
            fn, inputs = baseline_fn if baseline_fn is not None else program_callable(prog)
            with phase("baselines"):     # torch's time, not the agent's (phases.EXCLUDED)
                base = measure_baselines(fn, inputs, compile_modes=compile_modes, trials=trials,
                                         compile_budget_s=compile_budget_s, emit=emit.emit)
        except Exception as exc:
            base = {"error": f"{type(exc).__name__}: {_first(exc)}"}
            emit.emit("error", message=f"baselines failed: {base['error']}")
        profile["baselines"] = base
        eager = (base.get("eager") or {}).get("ms")
        comp = best_compile_ms(base) if "error" not in base else None
        profile["speedup_vs_eager"] = eager / t.median_ms if eager else None
        profile["speedup_vs_compile"] = comp / t.median_ms if comp else None
        from ..profile.launched import launched_kernels
        with phase("baselines"):     # the kernel counts compared with torch's, after every timing
            e2e["launched"] = launched_kernels(exe.replay)


def _baseline_inputs_into(exe, baseline_fn, emit) -> str:
    """Load the inputs torch's baselines run on (bench's: the file's get_inputs()) into the executable,
    so ours is timed on the same data: a kernel whose traffic depends on its inputs (guarded loads skip
    the rows whose label is ignored) timed on the verification's random draws (an attention mask drawn
    half zeros, where the file pads 1/16) would be compared with torch on other work. What ours was
    timed on: "baseline inputs", or "random draws" where there are none or they do not fit."""
    if baseline_fn is None:
        return "random draws"
    try:
        exe(*baseline_fn[1])
    except Exception as exc:
        emit.log(f"ours is timed on random draws: the baselines' inputs do not fit the program ({_first(exc)})",
                 level="warning")
        return "random draws"
    return "baseline inputs"


def _json_safe(x):
    from .events import _plain
    return _plain(x)


def _write_outputs(result: OptimizeResult) -> None:
    from ..project_file import save_program
    out = Path(result.out_dir)
    save_program(result.program, out / "program.json")
    prof = dict(result.program.profile or {})
    prof["status"] = result.status
    (out / "profile.json").write_text(json.dumps(_json_safe(prof), indent=1))
