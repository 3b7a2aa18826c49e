"""Baselines timed in the same process as our kernels: torch eager and torch.compile (default and
reduce-overhead), all fp32 with TF32 off. Each is guarded: one that fails to build or run is reported
with its reason and the others go on.
"""
from __future__ import annotations

import time

from .timing import time_gpu

MODES = ("default", "reduce-overhead")


def strict_fp32() -> None:
    """fp32 everywhere: no TF32 in cuBLAS or cuDNN, highest matmul precision."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def source_callable(path: str):
    """(fn, inputs) of a KernelBench-format .py file: its Model on the GPU in eval mode."""
    import torch
    from ..importers import load_source
    mod = load_source(path)
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
    return model, inputs


def program_callable(program):
    """(fn, inputs) running the program op by op through torch on the GPU (eager semantics)."""
    from ..reference import parameter_tensors, random_inputs, run_reference
    params = parameter_tensors(program, "cuda")
    names = [program.values[v].name for v in program.inputs]
    drawn = random_inputs(program, 0, "cuda")
    inputs = [drawn[n] for n in names]

    def fn(*xs):
        out = run_reference(program, list(xs), params=params)
        return tuple(out.values())
    return fn, inputs


def measure_baselines(fn, inputs, *, compile_modes=MODES, trials: int = 20, compile_budget_s: float = 120.0,
                      emit=None) -> dict:
    """{"eager": {...}, "compile_default": {...}, "compile_reduce-overhead": {...}}: each entry
    {"ok", "ms", "timing", "compile_s"} or {"ok": False, "error"} or {"ok": False, "skipped"}."""
    import torch
    strict_fp32()
    out: dict[str, dict] = {}

    def run_guarded(key, f, build_s=0.0):
        try:
            with torch.no_grad():
                t = time_gpu(lambda: f(*inputs), trials=trials)
            out[key] = {"ok": True, "ms": t.median_ms, "timing": t.to_dict(), "compile_s": round(build_s, 3)}
        except Exception as exc:
            out[key] = {"ok": False, "error": _first_line(exc)}
        if emit is not None:
            e = out[key]
            emit("profile", scope="baseline", baseline=key, ms=e.get("ms"), ok=e["ok"],
                 error=e.get("error") or e.get("skipped"))

    run_guarded("eager", fn)
    spent = 0.0
    for mode in compile_modes:
        key = f"compile_{mode}"
        if spent > compile_budget_s:
            out[key] = {"ok": False, "skipped": f"torch.compile already took {spent:.0f} s on this problem "
                                                f"(budget {compile_budget_s:.0f} s)"}
            if emit is not None:
                emit("profile", scope="baseline", baseline=key, ms=None, ok=False, error=out[key]["skipped"])
            continue
        t0 = time.perf_counter()
        try:
            torch._dynamo.reset()
            cf = torch.compile(fn, mode=mode)
            with torch.no_grad():
                for _ in range(3 if mode == "reduce-overhead" else 1):  # cudagraph trees record on call 2-3
                    cf(*inputs)
            torch.cuda.synchronize()
        except Exception as exc:
            out[key] = {"ok": False, "error": _first_line(exc), "compile_s": round(time.perf_counter() - t0, 3)}
            spent += time.perf_counter() - t0
            if emit is not None:
                emit("profile", scope="baseline", baseline=key, ms=None, ok=False, error=out[key]["error"])
            continue
        build = time.perf_counter() - t0
        spent += build
        run_guarded(key, cf, build)
    return out


def best_compile_ms(baselines: dict) -> float | None:
    ms = [e["ms"] for k, e in baselines.items() if k.startswith("compile_") and e.get("ok")]
    return min(ms) if ms else None
