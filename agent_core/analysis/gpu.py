"""The GPU the estimates are made for: a small profile of measured peaks and launch costs.

Defaults are the H200 the project benchmarks on (DESIGN.md, "Measuring"): 4.2 TB/s measured copy
bandwidth, 51 TFLOP/s fp32, about 6 us per kernel launched from Python and 0.5 us per node of a
replayed CUDA graph. The on-chip budgets decide reduction schedules and fusion budgets.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPUProfile:
    name: str = "NVIDIA H200"
    bandwidth_gbs: float = 4200.0          # measured copy bandwidth (read + write), GB/s
    fp32_tflops: float = 51.0              # cuBLAS-class fp32 throughput
    # the tile GEMM's split TF32 (three tensor-core products, fp32-accurate), in fp32 FLOPs: 4096^3 in
    # 1.098 ms (125 TFLOP/s) and 1024 x 8192 x 8192 in 1.04 ms (132) on an H100 (benchmarks/h100-2026-12-06-s21,
    # -s23); the H200 has the same SMs and clocks
    split_tf32_tflops: float = 125.0
    launch_us_python: float = 6.0          # one kernel launched from Python (eager, CuPy)
    launch_us_graph: float = 0.5           # one node of a replayed CUDA graph
    sm_count: int = 132
    warp_size: int = 32
    max_threads_per_block: int = 1024
    shared_mem_per_block: int = 227 * 1024
    registers_per_block: int = 65536       # 32-bit registers
    l2_bytes: int = 60 * 1024 * 1024

    @property
    def bytes_per_ms(self) -> float:
        return self.bandwidth_gbs * 1e6

    @property
    def flops_per_ms(self) -> float:
        return self.fp32_tflops * 1e9

    @property
    def split_tf32_flops_per_ms(self) -> float:
        return self.split_tf32_tflops * 1e9

    def launch_ms(self, graph: bool = True) -> float:
        return (self.launch_us_graph if graph else self.launch_us_python) / 1e3

    @property
    def warp_row_max(self) -> int:
        """Longest row one warp reduces with the row in registers (32 floats per lane)."""
        return self.warp_size * 32

    @property
    def block_row_bytes(self) -> int:
        """Bytes of row data one block can hold on chip: a quarter of the register file, leaving the rest for
        addresses and temporaries (about 16K floats, as the codegen issue assumes)."""
        return self.registers_per_block * 4 // 4

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPUProfile":
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


H200 = GPUProfile()
