"""Baselines timed in the same process as our kernels: torch eager and torch.compile (default and
reduce-overhead unless other modes are asked for), all fp32 with TF32 off. Each is guarded: one that
fails to build or run, or that the compile budget leaves out, is reported with its reason and the
others go on. Each compiled mode also records how many kernels Inductor generated for it.
"""
from __future__ import annotations

import time

from ..text import first_line
from .inductor_kernels import first_call_counting_kernels
from .launched import launched_kernels
from .timing import DEFAULT_WARMUP, gpu_work, inductor_benchmarks_as_gpu_work, time_cpu, time_gpu

MODES = ("default", "reduce-overhead")
KNOWN_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")   # cudagraph trees record on call 2-3


def parse_modes(text: str) -> tuple[str, ...]:
    """"default,max-autotune" -> ("default", "max-autotune"); ValueError naming an unknown mode."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    unknown = [m for m in modes if m not in KNOWN_MODES]
    if unknown or not modes:
        raise ValueError(f"unknown torch.compile mode {', '.join(repr(m) for m in unknown) or '(none given)'}; "
                         f"choose from {', '.join(KNOWN_MODES)}")
    return modes


def strict_fp32() -> None:
    """fp32 everywhere: no TF32 in cuBLAS or cuDNN, highest matmul precision."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _first_line(exc: BaseException) -> str:
    text = first_line(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def source_callable(path: str, device: str = "cuda"):
    """(fn, inputs) of a KernelBench-format .py file: its Model on `device` in eval mode."""
    import torch
    from ..importers import load_source
    mod = load_source(path)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).to(device).eval()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    return model, inputs


def program_callable(program, device: str = "cuda"):
    """(fn, inputs) running the program op by op through torch on `device` (eager semantics)."""
    from ..reference import parameter_tensors, random_inputs, run_reference
    params = parameter_tensors(program, device)
    names = [program.values[v].name for v in program.inputs]
    drawn = random_inputs(program, 0, device)
    inputs = [drawn[n] for n in names]

    def fn(*xs):
        out = run_reference(program, list(xs), params=params)
        return tuple(out.values())
    return fn, inputs


def measure_baselines(fn, inputs, *, compile_modes=MODES, trials: int = 20, compile_budget_s: float = 120.0,
                      emit=None, device: str = "cuda") -> dict:
    """{"eager": {...}, "compile_default": {...}, "compile_reduce-overhead": {...}}: each entry
    {"ok", "ms", "timing", "compile_s"} or {"ok": False, "error"} or {"ok": False, "skipped"}; a compiled
    mode's entry also holds "inductor_kernels": {"generated", "extern"} or {"error"}, and on a GPU eager's
    and the last compiled mode's entries "launched": the kernels one call launches (profile.launched;
    torch._dynamo.reset() before each mode drops the earlier modes' code). A mode starts only
    while this problem's torch.compile time is under compile_budget_s. device "cpu": wall-clock
    medians (Inductor writes C++ there), for reading its kernel counts on a machine without a GPU."""
    import torch
    strict_fp32()
    on_gpu = device != "cpu"
    out: dict[str, dict] = {}

    def report(key):
        if emit is not None:
            e = out[key]
            emit("profile", scope="baseline", baseline=key, ms=e.get("ms"), ok=e["ok"],
                 error=e.get("error") or e.get("skipped"))

    def run_guarded(key, f, build_s=0.0, extra=None):
        try:
            with torch.no_grad():
                t = time_gpu(lambda: f(*inputs), trials=trials) if on_gpu else \
                    time_cpu(lambda: f(*inputs), trials=trials, warmup=DEFAULT_WARMUP)
            out[key] = {"ok": True, "ms": t.median_ms, "timing": t.to_dict(), "compile_s": round(build_s, 3)}
        except Exception as exc:
            out[key] = {"ok": False, "error": _first_line(exc)}
        out[key].update(extra or {})
        report(key)

    run_guarded("eager", fn)
    timed = {"eager": fn}
    spent = 0.0
    for mode in compile_modes:
        key = f"compile_{mode}"
        if spent > compile_budget_s:
            out[key] = {"ok": False, "skipped": f"over the compile budget: torch.compile already took {spent:.0f} s "
                                                f"on this problem (budget {compile_budget_s:.0f} s)"}
            report(key)
            continue
        t0 = time.perf_counter()
        # the reset drops every earlier mode's compiled code: called again (below, for its kernel
        # count), an earlier mode would compile anew inside the profiler, beside reduce-overhead's CUDA
        # graphs, and count another artifact than the one timed. Only the last mode compiled keeps its
        # count (the run at ca266de, which profiled every mode, lost 3 problems to CUDA faults at
        # --jobs 8 that did not come back without the compile baselines; cause unverified)
        timed = {"eager": fn}
        try:
            torch._dynamo.reset()
            cf = torch.compile(fn, mode=mode)
            with torch.no_grad(), inductor_benchmarks_as_gpu_work():
                _, kernels = first_call_counting_kernels(cf, inputs)   # the call that compiles
                with gpu_work():
                    for _ in range(2 if mode in CUDAGRAPH_MODES else 0):
                        cf(*inputs)
                    if on_gpu:
                        torch.cuda.synchronize()
        except Exception as exc:
            out[key] = {"ok": False, "error": _first_line(exc), "compile_s": round(time.perf_counter() - t0, 3)}
            spent += time.perf_counter() - t0
            report(key)
            continue
        build = time.perf_counter() - t0
        spent += build
        run_guarded(key, cf, build, {"inductor_kernels": kernels})
        timed[key] = cf
    if on_gpu:            # after every timing: the profiler stays out of them
        for key, f in timed.items():
            if out[key].get("ok"):
                with torch.no_grad():
                    out[key]["launched"] = launched_kernels(lambda: f(*inputs))
    return out


def best_compile_ms(baselines: dict) -> float | None:
    ms = [e["ms"] for k, e in baselines.items() if k.startswith("compile_") and e.get("ok")]
    return min(ms) if ms else None
