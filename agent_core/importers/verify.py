"""verify_import: the imported program, run by the reference interpreter, against the module."""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils._pytree import tree_flatten

from ..errors import StitchError
from ..ir import Program
from ..ops.common import torch_dtype
from ..reference import random_inputs, run_reference


def module_args(program: Program, inputs: dict[str, torch.Tensor]) -> list:
    """forward's arguments for a program draw: program inputs by name, baked values in between."""
    args = []
    for item in program.metadata.get("forward_args") or [{"input": program.values[v].name} for v in program.inputs]:
        args.append(inputs[item["input"]] if "input" in item else item["const"])
    return args


def device_inputs(program: Program, seed: int, device: str) -> dict[str, torch.Tensor]:
    """A draw made on the device, following the same init hints as reference.draw (not the same
    numbers): KernelBench inputs reach 17 GB, which the CPU's float64 draw cannot afford."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for vid in program.inputs:
        v = program.values[vid]
        init, shape, dt = v.init or {}, tuple(v.shape), torch_dtype(v.dtype)
        kind = init.get("kind", "normal")
        if kind == "randint" or not (dt.is_floating_point or dt == torch.bool):
            lo, hi = int(init.get("low", 0)), int(init.get("high", 2))
            t = torch.randint(lo, max(hi, lo + 1), shape, generator=gen, device=device, dtype=dt)
        elif dt == torch.bool:
            t = torch.rand(shape, generator=gen, device=device) < 0.5
        elif kind == "uniform":
            lo, hi = float(init.get("low", 0.0)), float(init.get("high", 1.0))
            t = (torch.rand(shape, generator=gen, device=device) * (hi - lo) + lo).to(dt)
        elif kind == "positive":
            t = (torch.rand(shape, generator=gen, device=device) + 0.1).to(dt)
        elif kind == "softmax":
            t = torch.randn(shape, generator=gen, device=device).softmax(-1).to(dt)
        else:
            t = torch.randn(shape, generator=gen, device=device).to(dt)
        out[v.name] = t
    return out


def verify_import(program: Program, module: torch.nn.Module, example_inputs_fn: Callable | None = None,
                  draws: int = 3, atol: float = 1e-4, rtol: float = 1e-4, *, device: str = "cpu") -> float:
    """Run module and program on `draws` random draws; return the largest absolute error.

    example_inputs_fn(seed) -> forward's argument list; by default each draw follows the program's
    input init hints. Raises StitchError naming the worst output when any output is not allclose.
    """
    module.eval().to(device)
    worst, worst_err = None, 0.0
    for k in range(draws):
        if example_inputs_fn is None:
            drawn = (random_inputs(program, seed=1000 + k) if device == "cpu"
                     else device_inputs(program, 1000 + k, device))
            args = module_args(program, drawn)
        else:
            try:
                args = list(example_inputs_fn(1000 + k))
            except TypeError:
                args = list(example_inputs_fn())
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        with torch.no_grad():
            want, _ = tree_flatten(module(*args))
        got = run_reference(program, tensors, device=device)
        want = [w for w in want if isinstance(w, torch.Tensor)]
        if len(want) != len(got):
            raise StitchError(f"the module returns {len(want)} tensors but the program has {len(got)} outputs")
        for (name, g), w in zip(got.items(), want):
            if tuple(g.shape) != tuple(w.shape):
                raise StitchError(f"output '{name}' has shape {list(g.shape)}, the module's {list(w.shape)}")
            if not (g.is_floating_point() or w.is_floating_point()):
                err = float((g.long() != w.long()).any())
                ok = err == 0
            else:
                dt = torch.promote_types(g.dtype, w.dtype)
                if not dt.is_floating_point:
                    dt = torch.float32
                g64, w64 = g.to(dt), w.to(dt)
                diff = (g64 - w64).abs()
                both_nan = torch.isnan(g64) & torch.isnan(w64)
                diff = torch.where(both_nan, torch.zeros_like(diff), diff)
                diff = torch.nan_to_num(diff, nan=float("inf"))
                err = float(diff.max()) if diff.numel() else 0.0
                ok = bool((diff <= atol + rtol * w64.abs().nan_to_num(0)).all())
            if err >= worst_err:
                worst_err = err
            if not ok and (worst is None or err > worst[1]):
                worst = (name, err, k)
    if worst is not None:
        name, err, k = worst
        raise StitchError(f"the imported program differs from the module: output '{name}' is off by up to "
                          f"{err:.3g} on draw {k} (atol {atol:g}, rtol {rtol:g})")
    return worst_err
