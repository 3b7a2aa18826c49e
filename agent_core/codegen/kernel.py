"""What code generation hands to the compiler and the runtime: a kernel's source and how to launch it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import StitchError


def pow2_at_least(n: float) -> int:
    """The least power of two >= n (1 for n <= 1): thread counts, tiles, cluster sizes."""
    return 1 << max(0, math.ceil(math.log2(max(1.0, n))))


class CodegenError(StitchError):
    """A region cannot be generated (an op, dtype, shape or structure the generator does not handle).

    The message says which node or value is the reason, so the planner can log it and fall back.
    """

    def __init__(self, message: str, node_id: str | None = None):
        super().__init__(message)
        self.node_id = node_id


@dataclass
class KernelSource:
    """A generated CUDA kernel, specialised for the shapes of one region.

    The kernel's arguments are device pointers: every external input (value ids in `inputs`, in
    order), then every external output (`outputs`). Shapes are compile-time constants in the source,
    so a launch passes nothing else.
    """
    name: str                       # the extern "C" entry point, named after the region
    kind: str                       # "pointwise" or "row_reduction"
    source: str
    node_ids: list[str]
    inputs: list[str]
    outputs: list[str]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    schedule: str = ""              # one line a user reads: "float4 grid-stride loop, 256 threads"
    params: dict = field(default_factory=dict)  # the launch / tuning parameters used
    align: int = 4                  # bytes every pointer argument must be aligned to
    bytes_moved: int = 0            # external bytes read once plus bytes written: the memory floor
    flops: int = 0
    # nodes run before the kernel through their torch implementation (cuBLAS / cuDNN): a matmul or
    # convolution whose epilogue this kernel is; their outputs are among the kernel's inputs
    library_nodes: list[str] = field(default_factory=list)
    # scratch buffers the runtime appends to the arguments, zeroed once and left zeroed by the kernel:
    # (dtype, elements) pairs (a split reduction's partial states and arrival counters)
    workspace: list[tuple[str, int]] = field(default_factory=list)
    # TMA copies' tensor maps the runtime encodes from the bound inputs and passes first, by value
    # (runtime/tensor_map.py): {"input", "rows", "cols", "row_stride", "box_rows", "box_cols"} each, an input's
    # 2-D fp32 [rows, cols] matrix (row_stride elements apart) copied in boxes, 128-byte swizzled
    tensor_maps: list[dict] = field(default_factory=list)
    # other forms of the same region the tuner also tries, as generate_kernel params (a library call
    # + epilogue kernel's region: the matmul and its epilogue as one tile GEMM, codegen/gemm_mma.py)
    alternatives: list[dict] = field(default_factory=list)

    @property
    def filename(self) -> str:
        return f"{self.name}.cu"
