"""Peak GPU memory of one run of torch eager and of our end-to-end program, in the same process, from
the caching allocator's counters (torch.cuda.reset_peak_memory_stats, then its "requested_bytes" peak).

Both figures are the peak of requested bytes during the run above what was requested just before it,
so the weights and inputs each side already holds are left out of both, and the outputs (alive at the
end) are in both. Requested, not allocated: the allocator hands out a large block whole when what
would be left of its segment is under 1 MiB, and counts it whole as allocated, so the same calls read
up to 1 MiB apart by the pool's history (39_GRU: the same cuDNN call read 185 KiB more in our
graph's fresh pool than in eager's warm one, and 16 bytes more requested: the graph state below).
Both are steady-state runs: cuBLAS keeps one workspace (32 MiB on Hopper) per stream it has run on,
made at its first call there and kept, and torch.compile's CUDA graphs (mode reduce-overhead) free them
all while they record. Made again inside our window (at the warm-up, before the capture's peak) it
read as ours = the memory plan's prediction + 33 MiB in every program with a cuBLAS call (H200,
5409f06: 11_VGG16 278.9 MiB against 245.0 predicted and eager's 245.0), and inside eager's only when
its peak came after its first matmul. So both streams' workspaces are made before either window
(ready_blas_workspaces) and counted in neither, as in a process that has run both before. Our
capture drops every workspace and makes its own in its graph's pool (executable.own_blas_workspaces),
so before our window only the capture stream's is left: the drop inside frees just that one, which the
capture makes again, and one workspace is held throughout, as in eager's window.
Likewise a CUDA graph is kept alive over both windows (hold_graph_rng_state), so the default
generator's 16 bytes of graph state, made when a process's first graph registers, are in neither.
- eager: one forward of the model (no_grad) on its inputs, both already on the GPU.
- ours: building a fresh executable (the graph's private pool filled by the warm-up and capture runs:
  every intermediate and temporary, cuDNN's workspaces, the caches of its parameters) and one replay,
  less the copies of the weights and the static inputs the executable makes for itself (the ones
  eager holds before its run), plus the generated kernels' scratch buffers, which the executables
  share and were allocated earlier.
Caches that outlive a run count where they are made: a split-TF32 parameter's (hi, lo) parts are two
more copies of the weight, a concatenated convolution weight three; `parts` says how much of ours is
parameter caches and how much values and temporaries, so what dominates is read from the record.
"""
from __future__ import annotations


def ready_blas_workspaces(streams=None) -> None:
    """Make cuBLAS's and cuBLASLt's workspaces on `streams` (default: the current stream and the
    executables' capture stream), where none is: one small matmul, and a linear with a bias vector
    (torch runs that one through cuBLASLt, with its own 1 MiB workspace), on each."""
    import torch

    from ..program_runtime.executable import capture_stream
    a, bias = torch.ones(8, 8, device="cuda"), torch.ones(8, device="cuda")
    capture = capture_stream(torch)
    capture.wait_stream(torch.cuda.current_stream())
    for stream in streams or (torch.cuda.current_stream(), capture):
        with torch.cuda.stream(stream):
            torch.mm(a, a)
            torch.nn.functional.linear(a, a, bias)
    torch.cuda.synchronize()


def hold_graph_rng_state():
    """A CUDA graph to keep alive over both windows. torch makes the default generator's graph state
    (seed and offset, 8 bytes each) when the first graph registers and frees it with the last, so in
    a process with no other graph ours read 16 bytes above eager's where their peaks were the same
    (13_DenseNet121TransitionLayer, the GRUs, ...). torch.compile's reduce-overhead graphs hold the
    same state: it is process state, made before both windows as cuBLAS's workspaces are."""
    import torch
    graph, x = torch.cuda.CUDAGraph(), torch.zeros(1, device="cuda")
    try:
        with torch.cuda.graph(graph):
            x.add_(1)
    except RuntimeError:        # no graphs here: ours runs without one too (executable.graph_error)
        return None
    torch.cuda.synchronize()
    return graph, x


def drop_blas_workspaces() -> int:
    """Drop every cuBLAS workspace (as the executable's capture does); the bytes that freed."""
    import torch

    from ..program_runtime.executable import own_blas_workspaces
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    own_blas_workspaces(torch)
    torch.cuda.synchronize()
    return held - torch.cuda.memory_allocated()


def peak_above(run) -> int:
    """Peak requested bytes while run() runs, above those requested when it starts (the module
    docstring says why not allocated bytes)."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_stats()["requested_bytes.all.current"]
    keep = run()          # kept until the peak is read: outputs count, as they do in a real call
    torch.cuda.synchronize()
    peak = torch.cuda.memory_stats()["requested_bytes.all.peak"] - before
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
    scratch = sum(w.untyped_storage().nbytes() for lk in loaded for w in (getattr(lk, "_scratch", None) or ()))
    built: list = []

    def run():
        exe = build_executable(program, fused, graph=graph, device="cuda")
        built.append(exe)
        return exe.replay()
    if graph:
        # the capture drops every cuBLAS workspace and makes its own in the graph's pool
        # (executable.own_blas_workspaces): the current stream's is dropped before the window, so
        # that inside it the drop frees only the capture stream's, which the capture makes again.
        # One workspace throughout, as eager holds one; else ours read up to 33 MiB low (H200).
        from ..program_runtime.executable import capture_stream
        drop_blas_workspaces()
        ready_blas_workspaces([capture_stream(torch)])
    raw = peak_above(run)
    exe = built.pop()
    if graph and not drop_blas_workspaces():
        # the capture made none (no cuBLAS call), so the drop inside the window freed the capture
        # stream's without making it again: once more, with no workspace before the window
        exe = None
        raw = peak_above(run)
        exe = built.pop()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()     # once each: an RNN's
                for t in list(exe.params.values()) + list(exe.inputs)              # weights share one
                if isinstance(t, torch.Tensor)}
    own = sum(storages.values())
    total = max(0, raw - own) + scratch
    caches = cached_bytes(exe.params.values())
    predicted = exe.memory.predicted_peak_bytes
    exe = None
    return {"bytes": total, "predicted": predicted,
            "parts": {"parameter_caches": caches, "values_and_temporaries": max(0, total - caches)}}


def peak_memory_record(program, fused: dict, graph: bool, eager_fn, eager_inputs) -> dict:
    """The bench record's fields: peak_mem_eager_bytes, peak_mem_ours_bytes, peak_mem_ratio (ours /
    eager), peak_mem_ours_parts."""
    ready_blas_workspaces()
    held = hold_graph_rng_state()
    eager = eager_peak(eager_fn, eager_inputs)
    ours = ours_peak(program, fused, graph)
    del held
    return {"peak_mem_eager_bytes": eager, "peak_mem_ours_bytes": ours["bytes"],
            "peak_mem_ratio": round(ours["bytes"] / eager, 4) if eager else None,
            "peak_mem_predicted_bytes": ours["predicted"], "peak_mem_ours_parts": ours["parts"]}
