"""Generate every region's kernels up front and compile them in parallel, before the loop needs them.

The loop takes regions one by one: generate, compile, then verify and time on a GPU. Compiling is
most of a large model's agent time, and each compile waits on NVRTC alone, so this generates each
region's default kernel and its tuning variants (the same calls, parameters and order the loop makes)
and hands them to compiler.prefetch, which compiles them in a thread pool, each distinct kernel once
(compiler.py: canonical forms). The loop then takes the kernels from here instead of generating them
again, and its compile_kernel waits only for what is not finished yet. A region the loop treats
differently (a view, a library call) is simply left out: nothing here decides an outcome.
"""
from __future__ import annotations

from ..codegen import generate_kernel
from ..compiler import prefetch
from .region_kinds import without_kernel
from .tune import tune_space


def _params_key(params: dict | None) -> str:
    return repr(sorted(params.items())) if params else ""


class KernelPrefetch:
    """KernelSources generated ahead of the loop, by (region, kernel name, parameters); each is
    handed out once (take), so the loop owns what it gets exactly as if it had generated it."""

    def __init__(self, program, *, arch: str | None, tune: bool, tune_trials: int, sm_count: int = 132):
        self.program, self.arch = program, arch
        self.tune, self.tune_trials, self.sm_count = tune, tune_trials, sm_count
        self.kernels: dict[tuple, object] = {}
        self.started = 0        # compiles started in the background (not cached, not already running)

    def start(self, regions, name_of) -> "KernelPrefetch":
        """Generate the kernels of `regions` (name_of(region) -> kernel name) and start compiling them."""
        batch = []
        for r in regions:
            if without_kernel(self.program, r.nodes) is not None:    # the loop generates nothing for it
                continue
            name = name_of(r)
            try:
                ks = generate_kernel(self.program, r.nodes, name=name, kind=r.kind)
            except Exception as exc:   # take() raises it where the loop generates: the same reason
                self.kernels[(r.id, name, "")] = exc
                continue
            self.kernels[(r.id, name, "")] = ks
            batch.append(ks)
            if self.tune:
                for params in tune_space(ks, sm_count=self.sm_count, limit=self.tune_trials):
                    try:
                        k2 = generate_kernel(self.program, r.nodes, name=name, kind=r.kind, params=params)
                    except Exception:
                        continue
                    self.kernels[(r.id, name, _params_key(params))] = k2
                    batch.append(k2)
        self.started = prefetch(batch, arch=self.arch)
        return self

    def take(self, region, name: str, params: dict | None = None):
        """The kernel generated for (region, name, params), once; None when there is none. When its
        generation failed, the same exception is raised here, as generate_kernel raised it."""
        got = self.kernels.pop((region.id, name, _params_key(params)), None)
        if isinstance(got, Exception):
            raise got
        return got
