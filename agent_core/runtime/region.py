"""A region ready to run: its verified kernel, or its unfused ops with the reason it fell back.

build_region goes generate -> compile -> load -> verify; any step that fails (CodegenError,
CompileError, LaunchError, a mismatch against the reference) makes the region fall back to running its
ops one by one through their torch implementations, and the reason is recorded in its log entry.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..codegen import KernelSource, generate_kernel, region_io
from ..compiler import compile_kernel
from ..errors import StitchError
from ..ir import Program
from ..verify import VerifyResult, verify_region
from .split_tf32 import run_library_node


def strict_fp32() -> None:
    """TF32 off for cuBLAS and cuDNN: library calls must match the fp32 reference within 1e-4
    (cuDNN convolutions use TF32 by default)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@dataclass
class RegionRunner:
    program: Program
    name: str
    node_ids: list[str]
    inputs: list[str]
    outputs: list[str]
    kernel: KernelSource | None = None
    loaded: object | None = None          # runtime.launch.LoadedKernel
    fallback_reason: str | None = None
    verify: VerifyResult | None = None
    log: list[dict] = field(default_factory=list)

    @property
    def fused(self) -> bool:
        return self.loaded is not None

    def run_unfused(self, ins):
        env = dict(zip(self.inputs, ins))
        for nid in self.node_ids:
            run_library_node(self.program, nid, env)
        return [env[v] for v in self.outputs]

    def __call__(self, ins, outs=None):
        """Region input tensors (in `inputs` order) -> output tensors (in `outputs` order)."""
        if self.loaded is not None and self.kernel.library_nodes:
            import torch
            env = dict(zip(self.inputs, ins))
            strict_fp32()
            with torch.no_grad():
                for nid in self.kernel.library_nodes:   # cuBLAS / cuDNN through torch
                    run_library_node(self.program, nid, env)
            res = self.loaded([env[v].contiguous() for v in self.kernel.inputs])
            env.update(zip(self.kernel.outputs, res))
            res = [env[v] for v in self.outputs]
            if outs is not None:
                for o, r in zip(outs, res):
                    o.copy_(r.reshape(o.shape))
                return list(outs)
            return res
        if self.loaded is not None:
            return self.loaded(ins, outs)
        import torch
        strict_fp32()
        with torch.no_grad():
            res = self.run_unfused(ins)
        if outs is not None:
            for o, r in zip(outs, res):
                o.copy_(r.reshape(o.shape))
            return list(outs)
        return res

    def run_env(self, env: dict) -> None:
        """Read inputs from env (value id -> tensor) and write outputs there."""
        for vid, t in zip(self.outputs, self([env[v] for v in self.inputs])):
            env[vid] = t.reshape(self.program.values[vid].shape)


def build_region(program: Program, node_ids, *, name: str, kind: str | None = None,
                 params: dict | None = None, draws: int = 5, device: str = "cuda",
                 verify: bool = True) -> RegionRunner:
    io = region_io(program, node_ids)
    runner = RegionRunner(program, name, io.nodes, io.inputs, io.outputs)

    def note(event: str, **data):
        runner.log.append({"event": event, "region": name, **data})

    try:
        t0 = time.perf_counter()
        ks = generate_kernel(program, node_ids, name=name, kind=kind, params=params)
        runner.kernel = ks
        note("codegen", kind=ks.kind, schedule=ks.schedule, seconds=time.perf_counter() - t0)
        c = compile_kernel(ks)
        note("compile", cached=c.cached, seconds=c.seconds, registers=c.registers,
             spill_stores=c.spill_stores, spill_loads=c.spill_loads, arch=c.arch)
        from .launch import load_kernel
        loaded = load_kernel(ks, program, c)
        if verify:
            runner.loaded, runner.kernel = loaded, ks
            res = verify_region(program, io.inputs, io.outputs, lambda ins: runner(ins), draws=draws,
                                device=device)
            runner.loaded = None
            runner.verify = res
            note("verify", **res.as_dict())
            if not res.ok:
                raise _Mismatch(f"verification failed: {res.reason}")
        runner.loaded = loaded
    except StitchError as exc:
        runner.fallback_reason = str(exc)
        note("fallback", reason=str(exc))
    return runner


class _Mismatch(StitchError):
    pass
