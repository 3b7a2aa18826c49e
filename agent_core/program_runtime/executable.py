"""The end-to-end program on the GPU: one arena, one stream, one CUDA graph.

Generated kernels write into views of the arena (one torch.empty of bytes) and are launched with raw
device pointers on torch's current stream (cupy.cuda.ExternalStream), so capturing them into a
torch.cuda.CUDAGraph records the launches like any torch op. Library calls and unfused nodes run
through torch; whatever they allocate during capture lives in the graph's private pool. Inputs are
static tensors the caller may write into directly (zero copy); outputs are the tensors the graph
writes (valid until the next replay).
"""
from __future__ import annotations

import warnings

import numpy as np

from ..errors import StitchError
from ..ir import Program
from ..reference import parameter_tensors, random_inputs, run_reference
from .library_calls import run_library_call
from .steps import Step, plan_steps


class ExecutableError(StitchError):
    """The end-to-end program could not be built or run."""


_STREAMS: dict = {}
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


def _release_after(program, steps) -> list[list[str]]:
    """Per step, the values no later step reads (program outputs, inputs and parameters kept), so a
    run drops them from its environment: torch's own allocations then go back to its pool for the
    next step, as eager's do, and arena views are only forgotten."""
    keep = set(program.outputs) | set(program.inputs)
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for nid in s.nodes:
            node = program.nodes[nid]
            for v in list(node.inputs) + list(node.outputs):
                if v is not None and v not in keep and program.values[v].producer is not None:
                    last[v] = i
    out: list[list[str]] = [[] for _ in steps]
    for v, i in last.items():
        out[i].append(v)
    return out


def cupy_stream():
    """CuPy's view of torch's current stream (cached per stream), so launches join torch's order."""
    import cupy
    import torch
    ptr = torch.cuda.current_stream().cuda_stream
    s = _STREAMS.get(ptr)
    if s is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _STREAMS[ptr] = cupy.cuda.ExternalStream(ptr)
    return s


def raw_launch(loaded, inputs, outputs) -> None:
    """Launch a runtime.launch.LoadedKernel on torch's current stream with the tensors' raw device
    pointers passed by value: no DLPack exchange and nothing that synchronises, so it can be captured
    into a CUDA graph. The caller guarantees contiguous, aligned tensors of the right sizes."""
    import torch
    ks = loaded.kernel
    ptrs = [t.data_ptr() for t in inputs] + [t.data_ptr() for t in outputs]
    ptrs += [w.data_ptr() for w in loaded._workspace(torch)]
    args = tuple(np.uint64(p) for p in ptrs)
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
        memory_budget: the peak bytes split-TF32 caches may take us to (default: eager's, estimated)."""
        import torch
        self.program = program
        self.device = device
        self.steps, self.arena_plan = plan_steps(program, {r: (n, ks) for r, (n, ks, _) in fused.items()},
                                                 memory_budget)
        self.memory = self.arena_plan.memory
        self._release = _release_after(program, self.steps)
        for s in self.steps:
            if s.kind == "kernel":
                s.loaded = fused[s.region][2]
        self.arena = torch.empty(max(1, self.arena_plan.total_bytes), dtype=torch.uint8, device=device)
        self._arena_ptr = self.arena.untyped_storage().data_ptr()
        self.params = parameter_tensors(program, device)
        self.inputs = [_valid_placeholder(torch, program.values[v], device) for v in program.inputs]
        self.views = {}
        temps = self.memory.temps if self.memory is not None else {}
        for vid, slot in self.arena_plan.slots.items():
            shape, dtype = temps[vid] if vid in temps else (program.values[vid].shape, program.values[vid].dtype)
            dt = _torch_dtype(torch, dtype)
            self.views[vid] = self.arena[slot.offset:slot.offset + slot.nbytes].view(dt).view(tuple(shape))
        self.graph = None
        self.graph_error: str | None = None
        self.outputs = None
        if graph:
            self._capture()

    # --- running -------------------------------------------------------------------------------
    def _run_library(self, nid: str, env: dict) -> None:
        """cuBLAS / cuDNN through torch (fp32, or split TF32), into its arena slot when it has one."""
        run_library_call(self.program, nid, env, self.views, self.memory.decisions if self.memory else {})

    def _launch(self, torch, step: Step, env: dict) -> None:
        ks = step.kernel
        for nid in step.library_nodes:
            self._run_library(nid, env)
        ins = []
        for v in ks.inputs:
            env[v] = launchable(env[v], ks.align)
            ins.append(env[v])
        outs = [self.views[v] for v in ks.outputs]
        raw_launch(step.loaded, ins, outs)
        env.update(zip(ks.outputs, outs))

    def _execute(self) -> list:
        import torch
        env = dict(self.params)
        env.update(zip(self.program.inputs, self.inputs))
        with torch.no_grad():
            for i, step in enumerate(self.steps):
                if step.kind == "kernel":
                    self._launch(torch, step, env)
                else:
                    nid = step.nodes[0]
                    self._run_library(nid, env)
                    if not step.view:
                        for v in self.program.nodes[nid].outputs:   # a torch view into the arena would outlive its slot
                            t = env.get(v)
                            if isinstance(t, torch.Tensor) and t is not self.views.get(v) \
                                    and t.untyped_storage().data_ptr() == self._arena_ptr:
                                env[v] = t.clone()
                for v in self._release[i]:
                    env.pop(v, None)
        return [env[v] for v in self.program.outputs]

    def _capture(self) -> None:
        import torch
        from ..runtime.region import strict_fp32
        strict_fp32()
        stream = capture_stream(torch)
        stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(stream):
                self._execute()      # warm-up: loads modules, allocates workspaces, cuBLAS handles
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                outs = self._execute()
            torch.cuda.synchronize()
            self.graph, self.outputs = g, outs
        except Exception as exc:  # e.g. an op that synchronises: run the steps one by one instead
            torch.cuda.synchronize()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            self.graph_error = f"CUDA graph capture failed ({type(exc).__name__}: {first[:200]}); steps run one by one"
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
                "arena_bytes": self.arena_plan.total_bytes, "arena_naive_bytes": self.arena_plan.naive_bytes,
                "order": [s.label(self.program) for s in self.steps]}

    def verify(self, draws: int = 5, seed: int = 0, ref=None):
        """The whole program against the reference interpreter on `draws` random draws (seeds seed..);
        ref: an agent.refcache.ReferenceCache whose draws to reuse (its seeds are 0..)."""
        from ..verify import check_draws
        p = self.program

        def sample(d):
            if ref is not None:
                return ref.inputs(seed + d), ref.outputs(seed + d)
            drawn = random_inputs(p, seed + d)
            out = run_reference(p, drawn)
            return [drawn[p.values[v].name] for v in p.inputs], [out[p.values[v].name] for v in p.outputs]
        return check_draws(p, p.outputs, sample, lambda ins: self(*ins), draws=draws, device=self.device,
                           who="the program")
