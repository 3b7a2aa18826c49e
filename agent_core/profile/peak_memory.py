"""Peak GPU memory of one run of torch eager and of our end-to-end program, in the same process, from
the caching allocator's counters (torch.cuda.reset_peak_memory_stats / max_memory_allocated).

Both figures are the peak of allocated bytes during the run above what was allocated just before it,
so the weights and inputs each side already holds are left out of both, and the outputs (alive at the
end) are in both. The allocator's own block rounding (512 bytes) is counted as it allocates. Both
are meant as steady-state runs, each side's cuBLAS workspace made before its window and counted in
neither; but at 5409f06 (H200) ours still read about 33 MiB above the memory plan's prediction in
every program with a cuBLAS call and exactly on it without one (11_VGG16 278.9 MiB against 245.0
predicted and eager's 245.0): some workspace is still made inside our window, not yet found (tools/
memtrace.py). Freeing the workspaces first (tried at 18ac8e7) measured a cold start instead,
unequally: ours re-made its 32 MiB in the warm-up, before the capture's peak, eager at its
classifier, after its own.
- eager: one forward of the model (no_grad) on its inputs, both already on the GPU.
- ours: building a fresh executable (the graph's private pool filled by the warm-up and capture runs:
  every intermediate and temporary, cuBLAS/cuDNN workspaces for its side stream, the caches of its
  parameters) and one replay, less the copies of the weights and the
  static inputs the executable makes for itself (the ones eager holds before its run), plus the
  generated kernels' scratch buffers, which the executables share and were allocated earlier.
Caches that outlive a run count where they are made: a split-TF32 parameter's (hi, lo) parts are two
more copies of the weight, a concatenated convolution weight three; `parts` says how much of ours is
parameter caches and how much values and temporaries, so what dominates is read from the record.
"""
from __future__ import annotations

from ..program_runtime.memory_plan import rounded


def peak_above(run) -> int:
    """Peak allocated bytes while run() runs, above those allocated when it starts."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    keep = run()          # kept until the peak is read: outputs count, as they do in a real call
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del keep
    return max(0, peak)


def eager_peak(fn, inputs) -> int:
    import torch

    def forward():
        with torch.no_grad():
            return fn(*inputs)
    return peak_above(forward)


def fused_of(executable) -> dict:
    """The executable's kept kernels as build_executable takes them: region -> (nodes, source, loaded)."""
    return {s.region: (s.nodes, s.kernel, s.loaded) for s in executable.steps if s.kind == "kernel"}


def ours_peak(program, fused: dict, graph: bool) -> dict:
    """{"bytes", "predicted", "parts": {"parameter_caches", "values_and_temporaries"}} of building and
    running once the executable of these kept kernels (fused_of an earlier one; in a CUDA graph when
    `graph`); predicted: the memory plan's figure."""
    import torch

    from ..program_runtime import build_executable
    from ..runtime.split_tf32 import cached_bytes
    # kernels' scratch buffers are made once per loaded kernel, which the executables share: those
    # made before the window are added, those made inside it are already in the peak
    loaded = {id(lk): lk for _, _, lk in fused.values()}.values()
    scratch = sum(rounded(w.untyped_storage().nbytes()) for lk in loaded for w in (getattr(lk, "_scratch", None) or ()))
    built: list = []

    def run():
        exe = build_executable(program, fused, graph=graph, device="cuda")
        built.append(exe)
        return exe.replay()
    raw = peak_above(run)
    exe = built.pop()
    own = sum(rounded(t.untyped_storage().nbytes()) for t in list(exe.params.values()) + list(exe.inputs)
              if isinstance(t, torch.Tensor))
    total = max(0, raw - own) + scratch
    caches = cached_bytes(exe.params.values())
    predicted = exe.memory.predicted_peak_bytes
    exe = None
    return {"bytes": total, "predicted": predicted,
            "parts": {"parameter_caches": caches, "values_and_temporaries": max(0, total - caches)}}


def peak_memory_record(program, fused: dict, graph: bool, eager_fn, eager_inputs) -> dict:
    """The bench record's fields: peak_mem_eager_bytes, peak_mem_ours_bytes, peak_mem_ratio (ours /
    eager), peak_mem_ours_parts."""
    eager = eager_peak(eager_fn, eager_inputs)
    ours = ours_peak(program, fused, graph)
    return {"peak_mem_eager_bytes": eager, "peak_mem_ours_bytes": ours["bytes"],
            "peak_mem_ratio": round(ours["bytes"] / eager, 4) if eager else None,
            "peak_mem_predicted_bytes": ours["predicted"], "peak_mem_ours_parts": ours["parts"]}
