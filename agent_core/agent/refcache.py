"""Reference results shared by every verification of one optimize run.

verify.verify_region runs the whole program through the reference for each region and draw; over a
program with many regions (and tuning trials) that is most of the loop's time. Here each draw runs
once and keeps only the values some check reads (region boundaries and program outputs). Large
programs run their reference on the GPU (the same torch ops, fp32, TF32 off), as the importers'
verification does, because the CPU would take seconds per draw.
"""
from __future__ import annotations

from ..ir import Program
from ..reference import parameter_tensors, random_inputs, run_reference

GPU_REFERENCE_FLOPS = 2e9      # above either of these the reference runs on the GPU when there is one
GPU_REFERENCE_BYTES = 64 << 20
ORIGINAL_OUTPUTS = "__original_outputs__"    # key of the original program's outputs in a draw


def device_inputs(program: Program, seed: int, device: str) -> dict:
    """reference.random_inputs drawn on the device itself (same init hints, another random stream):
    drawing hundreds of MB in float64 on the CPU and copying them takes seconds per draw."""
    import torch
    from ..ops.common import torch_dtype
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for vid in program.inputs:
        v = program.values[vid]
        init = v.init or {"kind": "normal"}
        kind, shape, dt = init.get("kind", "normal"), tuple(v.shape), v.dtype
        if kind == "randint" or dt in ("int64", "int32", "int8", "uint8"):
            lo, hi = int(init.get("low", 0)), int(init.get("high", 2))
            t = torch.randint(lo, max(hi, lo + 1), shape, generator=gen, device=device)
        elif dt == "bool":
            t = torch.rand(shape, generator=gen, device=device) < 0.5
        elif kind == "uniform":
            lo, hi = float(init.get("low", 0.0)), float(init.get("high", 1.0))
            t = torch.rand(shape, generator=gen, device=device) * (hi - lo) + lo
        elif kind == "positive":
            t = torch.rand(shape, generator=gen, device=device) + 0.1
        elif kind == "softmax":
            t = torch.randn(shape, generator=gen, device=device).softmax(-1)
        else:
            t = torch.randn(shape, generator=gen, device=device)
        out[v.name] = t.to(torch_dtype(dt))
    return out


class ReferenceCache:
    """Draws of the program's reference values, kept while they fit MAX_CACHED_BYTES: the first
    max_draws - 1 draws asked for stay for the run and the last slot takes whichever other draw was
    asked last (a recomputation costs one reference run, holding them all could cost GBs). Dropping
    the oldest instead made every access miss once a verification's draws outnumbered the slots
    (DenseNet201 on the H200: 4 slots, 5 draws, 5 reference runs of the whole model per region).

    original: the program before rewrites; when given, outputs() are its outputs on the same inputs,
    so the end-to-end check holds the optimized program to what the user wrote."""

    MAX_CACHED_BYTES = 8 << 30

    def __init__(self, program: Program, keep: set[str], *, device: str = "cpu", original: Program | None = None):
        self.program = program
        self.original = original
        self.keep = set(keep) | set(program.outputs) | set(program.inputs)
        self.device = device
        self._params = None
        self._original_params = None
        self._draws: dict[int, dict] = {}
        self._fit()

    def _fit(self) -> None:
        """As many draws as MAX_CACHED_BYTES holds of what each keeps."""
        per_draw = sum(self.program.values[v].nbytes for v in self.keep if v in self.program.values)
        if self.original is not None:
            per_draw += sum(self.original.values[v].nbytes for v in self.original.outputs)
        self.max_draws = max(1, int(self.MAX_CACHED_BYTES // max(1, per_draw)))

    def also_keep(self, values) -> None:
        """Keep these values too (the boundaries of regions split after the draws were made): the
        draws made so far lack them, so they are made again when next asked for."""
        new = set(values) - self.keep
        if not new:
            return
        self.keep |= new
        self._draws.clear()
        self._fit()

    @staticmethod
    def choose_device(program: Program, gpu: bool) -> str:
        if not gpu:
            return "cpu"
        flops = sum(program.node_flops(n) for n in program.nodes)
        nbytes = sum(v.nbytes for v in program.values.values())
        return "cuda" if flops > GPU_REFERENCE_FLOPS or nbytes > GPU_REFERENCE_BYTES else "cpu"

    def draw(self, d: int) -> dict:
        """value id -> tensor (on self.device) for draw d (seed d)."""
        env = self._draws.get(d)
        if env is None:
            if self._params is None:
                self._params = parameter_tensors(self.program, self.device)
            inputs = (random_inputs(self.program, d, self.device) if self.device == "cpu"
                      else device_inputs(self.program, d, self.device))
            full = run_reference(self.program, inputs, keep=True, params=self._params, device=self.device)
            env = {v: t for v, t in full.items() if v in self.keep}
            del full
            if len(self._draws) >= self.max_draws:
                self._draws.pop(next(reversed(self._draws)))    # the rotating slot; the first ones stay
            self._draws[d] = env
        return env

    def inputs(self, d: int) -> list:
        env = self.draw(d)
        return [env[v] for v in self.program.inputs]

    def outputs(self, d: int) -> list:
        """The expected program outputs of draw d (the original program's when there is one)."""
        env = self.draw(d)
        if self.original is None:
            return [env[v] for v in self.program.outputs]
        if ORIGINAL_OUTPUTS not in env:   # only the end-to-end check asks: not run per region
            if self._original_params is None:
                self._original_params = parameter_tensors(self.original, self.device)
            named = {self.program.values[v].name: env[v] for v in self.program.inputs}
            outs = run_reference(self.original, named, params=self._original_params, device=self.device)
            env[ORIGINAL_OUTPUTS] = [outs[self.original.values[v].name] for v in self.original.outputs]
        return env[ORIGINAL_OUTPUTS]


def verify_candidate(program: Program, cache: ReferenceCache, inputs: list[str], outputs: list[str], run,
                     draws: int = 5, device: str = "cuda"):
    """verify.verify_region over the cached draws."""
    from ..verify import check_draws, exact_outputs

    def sample(d):
        env = cache.draw(d)
        return [env[v] for v in inputs], [env[v] for v in outputs]
    return check_draws(program, outputs, sample, run, draws=draws, device=device,     # the cache's own weights
                       exact=lambda ins: exact_outputs(program, inputs, outputs, ins, params=cache._params))
