"""Launch compiled kernels on torch tensors through CuPy, zero copy (DLPack), on torch's stream."""
from __future__ import annotations

import math
import warnings

from ..codegen.kernel import KernelSource
from ..compiler import CompiledKernel, compile_kernel
from ..errors import StitchError
from .tensor_map import maps_for

_TORCH_DTYPES = {"float32": "float32", "bool": "bool", "int64": "int64", "int32": "int32", "uint8": "uint8",
                 "int8": "int8"}  # every dtype a generated kernel reads or writes


class LaunchError(StitchError):
    """A kernel could not be launched on the tensors given (device, shape, dtype, alignment)."""


def _torch():
    import torch
    return torch


def _cupy():
    try:
        import cupy
    except ImportError as exc:
        raise LaunchError(f"CuPy is not available ({exc}); kernels need cupy-cuda13x on a GPU") from None
    return cupy


_STREAMS: dict = {}


def cupy_stream():
    """CuPy's view of torch's current stream (cached per stream): kernels launched in it run in order
    with torch's work, and a CUDA graph capturing that stream captures them."""
    ptr = _torch().cuda.current_stream().cuda_stream
    s = _STREAMS.get(ptr)
    if s is None:
        with warnings.catch_warnings():  # CuPy 14 deprecates the name, not the behaviour we use
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _STREAMS[ptr] = _cupy().cuda.ExternalStream(ptr)
    return s


class LoadedKernel:
    """A KernelSource compiled for the current GPU and loaded with cupy.RawModule.

    Calling it with the region's input tensors (in KernelSource.inputs order) returns the outputs;
    pass `outputs` to write into existing tensors.
    """

    def __init__(self, kernel: KernelSource, compiled: CompiledKernel | None = None, *, specs=None,
                 in_dtypes=None):
        cupy = _cupy()
        self.kernel = kernel
        self.compiled = compiled or compile_kernel(kernel)
        try:
            self.module = cupy.RawModule(path=str(self.compiled.path))
            self.function = self.module.get_function(self.compiled.entry)   # canonical: not kernel.name
        except Exception as exc:  # no driver or device, or a cubin for another architecture
            raise LaunchError(f"{kernel.name}: cannot load the kernel on a GPU "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
        # (shape, dtype) of each output, for allocation; the codegen knows them, the caller passes them
        self.specs = specs
        self.in_dtypes = in_dtypes  # torch dtype names of the inputs, checked at each call when known
        self.registers = self.function.num_regs
        self.local_bytes = self.function.local_size_bytes  # spills and stack live here
        self.shared_bytes = self.function.shared_size_bytes
        if kernel.shared_bytes > 48 * 1024:   # beyond 48 KiB of dynamic shared memory a block must opt in
            self.function.max_dynamic_shared_size_bytes = kernel.shared_bytes

    def _check(self, t, what: str, numel: int | None = None):
        torch = _torch()
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise LaunchError(f"{self.kernel.name}: {what} must be a CUDA tensor, got "
                              f"{getattr(t, 'device', type(t).__name__)}")
        if numel is not None and t.numel() != numel:
            raise LaunchError(f"{self.kernel.name}: {what} has {t.numel()} elements, the kernel was "
                              f"specialised for {numel}")

    def __call__(self, inputs, outputs=None, *, input_numels=None):
        torch, cupy = _torch(), _cupy()
        k = self.kernel
        if len(inputs) != len(k.inputs):
            raise LaunchError(f"{k.name} takes {len(k.inputs)} inputs, got {len(inputs)}")
        ins = []
        for j, t in enumerate(inputs):
            self._check(t, f"input {j}", input_numels[j] if input_numels else None)
            if self.in_dtypes and t.dtype != getattr(torch, self.in_dtypes[j]):
                raise LaunchError(f"{k.name}: input {j} is {t.dtype}, the kernel reads {self.in_dtypes[j]}")
            # a fresh allocation is contiguous and 256-byte aligned, which the float4 loads need
            if not t.is_contiguous() or t.data_ptr() % k.align:
                t = t.contiguous() if not t.is_contiguous() else t.clone()
            ins.append(t)
        if outputs is None:
            if self.specs is None:
                raise LaunchError(f"{k.name}: pass output tensors or output specs")
            outputs = [torch.empty(shape, dtype=getattr(torch, dt), device=ins[0].device if ins else "cuda")
                       for shape, dt in self.specs]
        for j, t in enumerate(outputs):
            self._check(t, f"output {j}", math.prod(self.specs[j][0]) if self.specs else None)
            if not t.is_contiguous() or t.data_ptr() % k.align:
                raise LaunchError(f"{k.name}: output {j} must be contiguous and {k.align}-byte aligned")
        self.bind(ins, outputs)()
        return list(outputs)

    def bind(self, inputs, outputs):
        """A no-argument launcher over fixed tensors (checked by the caller): what timing loops and
        replayed sequences call, without per-call argument conversion."""
        torch, cupy = _torch(), _cupy()
        k = self.kernel
        stream = cupy_stream()
        with stream:
            # DLPack views of the same memory (zero copy); bools travel as bytes, which every
            # DLPack consumer knows, and the kernel reads them as C++ bool (one byte)
            args = tuple(cupy.from_dlpack(t.view(torch.uint8) if t.dtype == torch.bool else t)
                         for t in list(inputs) + list(outputs) + self._workspace(torch))
        args = maps_for(k, list(inputs)) + args     # TMA tensor maps first, by value
        fn, grid, block, smem = self.function, k.grid, k.block, k.shared_bytes

        def launch():
            with stream:
                fn(grid, block, args, shared_mem=smem)
        launch.keepalive = (inputs, outputs)  # the tensors must outlive the launcher
        return launch

    def _workspace(self, torch) -> list:
        """Scratch buffers of the kernel (zeroed once; the kernel leaves them zeroed)."""
        if not self.kernel.workspace:
            return []
        if getattr(self, "_scratch", None) is None:
            self._scratch = [torch.zeros(max(1, n), dtype=getattr(torch, dt), device="cuda")
                             for dt, n in self.kernel.workspace]
        return self._scratch

    def attribution(self) -> dict:
        return {"registers": self.registers, "local_bytes": self.local_bytes,
                "shared_bytes": self.shared_bytes, "spill_stores": self.compiled.spill_stores,
                "spill_loads": self.compiled.spill_loads}


def load_kernel(kernel: KernelSource, program=None, compiled: CompiledKernel | None = None) -> LoadedKernel:
    """Compile (cached) for this GPU and load; with the program, outputs can be allocated by shape."""
    specs = in_dtypes = None
    if program is not None:
        specs = [(tuple(program.values[v].shape), _TORCH_DTYPES.get(program.values[v].dtype, "float32"))
                 for v in kernel.outputs]
        in_dtypes = [_TORCH_DTYPES.get(program.values[v].dtype, "float32") for v in kernel.inputs]
    return LoadedKernel(kernel, compiled, specs=specs, in_dtypes=in_dtypes)
