"""The end-to-end program on the GPU: one stream, one CUDA graph, one allocator.

Generated kernels write into tensors allocated as they run (torch.empty) and are launched with raw
device pointers on torch's current stream (cupy.cuda.ExternalStream), so capturing them into a
torch.cuda.CUDAGraph records the launches like any torch op. Library calls and unfused nodes run
through torch. Every intermediate is released after its last reader, so during capture all of them
share the graph's private pool by lifetime, as eager's share its allocator (memory_plan predicts the
peak). Inputs are static tensors the caller may write into directly (zero copy); outputs are the
tensors the graph writes (valid until the next replay).
"""
from __future__ import annotations


import numpy as np

from ..errors import StitchError
from ..ir import Program
from ..ops.recurrent import flatten_for_cudnn
from ..reference import parameter_tensors, random_inputs, run_reference
from ..runtime.launch import cupy_stream
from ..runtime.tensor_map import maps_for
from ..runtime.split_tf32 import run_library_node
from ..text import first_line
from .steps import Step, plan_steps


class ExecutableError(StitchError):
    """The end-to-end program could not be built or run."""


_CAPTURE_STREAMS: dict = {}


def capture_stream(torch):
    """One side stream per device for every warm-up and capture: cuBLAS keeps a workspace per stream
    it has run on, so a new stream per build held one more workspace each time, which counted in
    our peak memory and not in eager's (whose stream had its workspace before the run)."""
    dev = torch.cuda.current_device()
    s = _CAPTURE_STREAMS.get(dev)
    if s is None:
        s = _CAPTURE_STREAMS[dev] = torch.cuda.Stream()
    return s


def own_blas_workspaces(torch) -> None:
    """Drop cuBLAS's workspaces before a capture, so the captured calls make theirs again inside the
    graph's private pool and the graph owns them. A workspace made outside the capture (by the
    warm-up) is only borrowed: torch.compile's CUDA graphs (mode reduce-overhead) clear every
    workspace before and after they record, which freed the memory our graph's matmuls still wrote
    to (43_MinGPTCausalAttention and 44_MiniGPTBlock: an unspecified launch failure at our next
    replay, on the H200 only beside reduce-overhead). Inductor's cudagraph trees do the same."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _release_after(program, steps) -> list[list[list[str]]]:
    """Per step and per event of it (Step.events: each library call, then the kernel), the values no
    later event reads (program outputs, inputs and parameters kept), so a run drops them from its
    environment and their memory goes back to the pool at once, as eager's does."""
    keep = set(program.outputs) | set(program.inputs)
    last: dict[str, tuple[int, int]] = {}
    for i, s in enumerate(steps):
        for j, (reads, writes) in enumerate(s.events(program)):
            for v in reads + writes:
                if v not in keep and program.values[v].producer is not None:
                    last[v] = (i, j)
    out = [[[] for _ in s.events(program)] for s in steps]
    for v, (i, j) in last.items():
        out[i][j].append(v)
    return out


def _drop(env: dict, values: list[str]) -> None:
    for v in values:
        env.pop(v, None)


def raw_launch(loaded, inputs, outputs) -> None:
    """Launch a runtime.launch.LoadedKernel on torch's current stream with the tensors' raw device
    pointers passed by value: no DLPack exchange and nothing that synchronises, so it can be captured
    into a CUDA graph. The caller guarantees contiguous, aligned tensors of the right sizes."""
    import torch
    ks = loaded.kernel
    ptrs = [t.data_ptr() for t in inputs] + [t.data_ptr() for t in outputs]
    ptrs += [w.data_ptr() for w in loaded._workspace(torch)]
    args = maps_for(ks, ptrs) + tuple(np.uint64(p) for p in ptrs)   # TMA tensor maps first, by value
    with cupy_stream():
        loaded.function(ks.grid, ks.block, args, shared_mem=ks.shared_bytes)


def launchable(t, align: int):
    """t itself when a kernel can read it in place, else a contiguous, aligned copy."""
    if not t.is_contiguous():
        return t.contiguous()
    if t.data_ptr() % align:
        return t.clone()
    return t


def _torch_dtype(torch, dtype: str):
    from ..ops.common import torch_dtype
    return torch_dtype(dtype)


def _valid_placeholder(torch, value, device):
    """An input tensor the warm-up and capture runs may read: zeros, or the lowest index an integer
    input's init hint allows (uninitialised memory can hold out-of-range class indices, which trip
    device-side asserts in ops like nll_loss and poison the whole CUDA context)."""
    low = int((value.init or {}).get("low", 0)) if value.dtype in ("int64", "int32", "int8", "uint8") else 0
    return torch.full(tuple(value.shape), low, dtype=_torch_dtype(torch, value.dtype), device=device)


class ProgramExecutable:
    def __init__(self, program: Program, fused: dict[str, tuple[list[str], object, object]], *,
                 graph: bool = True, device: str = "cuda", memory_budget: int | None = None):
        """fused: region id -> (node ids, KernelSource, LoadedKernel) of the regions kept as kernels;
        memory_budget: the peak bytes split-TF32 forms may take us to (default: eager's, estimated)."""
        import torch
        self.program = program
        self.device = device
        self.steps, self.memory = plan_steps(program, {r: (n, ks) for r, (n, ks, _) in fused.items()},
                                             memory_budget)
        self._release = _release_after(program, self.steps)
        for s in self.steps:
            if s.kind == "kernel":
                s.loaded = fused[s.region][2]
        self.params = parameter_tensors(program, device)
        if device != "cpu":
            for node in program.nodes.values():
                if node.opdef.category == "recurrent":
                    flatten_for_cudnn(program, node, self.params)
        self.inputs = [_valid_placeholder(torch, program.values[v], device) for v in program.inputs]
        self.graph = None
        self.graph_error: str | None = None
        self.outputs = None
        if graph:
            self._capture()

    # --- running -------------------------------------------------------------------------------
    def _run_library(self, nid: str, env: dict) -> None:
        """cuBLAS / cuDNN through torch, in the form the agent chose unless the memory plan ran it in
        fp32 or split or converted its weights every call."""
        d = self.memory.decisions.get(nid)
        run_library_node(self.program, nid, env, form=d.runs_as if d else None,
                         cache_weights=nid not in self.memory.weights_per_call)

    def _output(self, torch, vid: str, env: dict, dying: set):
        """A kernel output's tensor: the input buffer the memory plan writes it over, else a new one."""
        v = self.program.values[vid]
        over = self._written_over(env, vid, dying)
        if over is not None:
            return over
        return torch.empty(tuple(v.shape), dtype=_torch_dtype(torch, v.dtype), device=self.device)

    def _written_over(self, env: dict, vid: str, dying: set):
        """The input tensor the memory plan has this kernel output written over (memory_plan.written_over),
        viewed in the output's shape; None when there is none or a value that outlives this kernel still
        shares its storage (a view the plan did not see)."""
        src = self.memory.written_over.get(vid)
        if src is None:
            return None
        t = env[src]
        ptr = t.untyped_storage().data_ptr()
        if any(k != src and k not in dying and k not in self.params and hasattr(u, "untyped_storage") and
               u.untyped_storage().data_ptr() == ptr for k, u in env.items()):
            return None
        return t.view(tuple(self.program.values[vid].shape))

    def _launch(self, torch, step: Step, env: dict, release: list[list[str]]) -> None:
        ks = step.kernel
        for nid, done in zip(step.library_nodes, release):
            self._run_library(nid, env)
            _drop(env, done)
        ins = []
        for v in ks.inputs:
            env[v] = launchable(env[v], ks.align)
            ins.append(env[v])
        outs = [self._output(torch, v, env, set(release[-1])) for v in ks.outputs]
        raw_launch(step.loaded, ins, outs)
        env.update(zip(ks.outputs, outs))

    def _execute(self) -> list:
        import torch
        env = dict(self.params)
        env.update(zip(self.program.inputs, self.inputs))
        with torch.no_grad():
            for i, (step, release) in enumerate(zip(self.steps, self._release)):
                self._step_at = i          # a capture that fails names the step it failed in
                if step.kind == "kernel":
                    self._launch(torch, step, env, release)
                else:
                    self._run_library(step.nodes[0], env)
                _drop(env, release[-1])
        return [env[v] for v in self.program.outputs]

    def _capture(self) -> None:
        import torch

        from ..profile.timing import gpu_work
        from ..runtime.region import strict_fp32
        strict_fp32()
        stream = capture_stream(torch)
        stream.wait_stream(torch.cuda.current_stream())
        run = "warm-up"
        self._step_at = 0
        try:
            # the warm-up and capture run the whole program: never during another problem's measurement
            with gpu_work(), torch.cuda.stream(stream):
                self._execute()      # warm-up: loads modules, allocates workspaces, cuBLAS handles
                torch.cuda.synchronize()
                own_blas_workspaces(torch)
                g = torch.cuda.CUDAGraph()
                run = "capture"
                # thread-local: only this thread's calls can spoil the capture, not another thread's
                with torch.cuda.graph(g, stream=stream, capture_error_mode="thread_local"):
                    outs = self._execute()
                torch.cuda.synchronize()
            self.graph, self.outputs = g, outs
        except Exception as exc:  # e.g. an op that synchronises: run the steps one by one instead
            torch.cuda.synchronize()
            step = self.steps[self._step_at].label(self.program) if self.steps else "no step"
            self.graph_error = (f"CUDA graph capture failed in its {run} run, noticed at step {self._step_at + 1} of "
                                f"{len(self.steps)}, {step} ({type(exc).__name__}: {first_line(exc)[:200]}); "
                                "steps run one by one")
            self.graph = None

    def replay(self):
        """Run once on the current inputs; returns the output tensors."""
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        from ..runtime.region import strict_fp32
        strict_fp32()
        self.outputs = self._execute()
        return self.outputs

    def __call__(self, *inputs):
        """Copy inputs into the static input tensors (skipped when they are those tensors) and run."""
        if len(inputs) != len(self.inputs):
            raise ExecutableError(f"the program takes {len(self.inputs)} inputs, got {len(inputs)}")
        for dst, src in zip(self.inputs, inputs):
            if src is not dst:
                dst.copy_(src)
        return self.replay()

    # --- facts ---------------------------------------------------------------------------------
    @property
    def kernel_steps(self) -> int:
        return sum(1 for s in self.steps if s.kind == "kernel")

    @property
    def launches(self) -> int:
        """Kernels a run launches: generated ones, their library calls, and non-view torch nodes."""
        return sum((1 + len(s.library_nodes)) if s.kind == "kernel" else (0 if s.view else 1) for s in self.steps)

    def summary(self) -> dict:
        return {"steps": len(self.steps), "generated_kernels": self.kernel_steps, "launches": self.launches,
                "cuda_graph": self.graph is not None, "graph_error": self.graph_error,
                "predicted_peak_bytes": self.memory.predicted_peak_bytes,
                "order": [s.label(self.program) for s in self.steps]}

    def verify(self, draws: int = 5, seed: int = 0, ref=None):
        """The whole program against the reference interpreter on `draws` random draws (seeds seed..);
        ref: an agent.refcache.ReferenceCache whose draws to reuse (its seeds are 0..)."""
        from ..verify import check_draws, exact_outputs
        p = self.program

        def sample(d):
            if ref is not None:
                return ref.inputs(seed + d), ref.outputs(seed + d)
            drawn = random_inputs(p, seed + d)
            out = run_reference(p, drawn)
            return [drawn[p.values[v].name] for v in p.inputs], [out[p.values[v].name] for v in p.outputs]

        def exact(ins):     # the program the expected outputs come from (the original of a rewritten one)
            target = getattr(ref, "original", None) or p
            by_name = {target.values[v].name: v for v in target.inputs}
            names = [p.values[v].name for v in p.inputs]
            if not all(n in by_name for n in names):
                return None
            return exact_outputs(target, [by_name[n] for n in names], list(target.outputs), ins)
        return check_draws(p, p.outputs, sample, lambda ins: self(*ins), draws=draws, device=self.device,
                           who="the program", exact=exact)
