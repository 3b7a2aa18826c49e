"""The reference interpreter: runs a program op by op through each op's torch implementation.

This is the ground truth that every rewrite and every generated kernel is checked against. Making a
run's random inputs or its parameters first asks memory_check whether the run's tensors fit, so a
program too large for the machine is refused before anything is allocated.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import torch

from .errors import ProgramError
from .ir import Program, Role
from .memory_check import require_fits
from .ops.common import torch_dtype


def random_inputs(program: Program, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """One random draw for every program input, by name, following each input's init hint.
    Refused (memory_check.DoesNotFit) when the run these inputs are for cannot fit on `device`."""
    require_fits(program, device)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for vid in program.inputs:
        v = program.values[vid]
        out[v.name] = draw(v.shape, v.dtype, v.init, gen).to(device)
    return out


def draw(shape, dtype: str, init: dict | None, gen: torch.Generator) -> torch.Tensor:
    init = init or {"kind": "normal"}
    kind = init.get("kind", "normal")
    shape = tuple(shape)
    if kind == "randint" or dtype in ("int64", "int32", "int8", "uint8"):
        lo, hi = int(init.get("low", 0)), int(init.get("high", 2))
        return torch.randint(lo, max(hi, lo + 1), shape, generator=gen).to(torch_dtype(dtype))
    if dtype == "bool":
        return torch.rand(shape, generator=gen) < 0.5
    if kind == "uniform":
        lo, hi = float(init.get("low", 0.0)), float(init.get("high", 1.0))
        t = torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo
    elif kind == "positive":
        t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.1
    elif kind == "softmax":  # rows of probabilities (KL divergence targets)
        t = torch.randn(shape, generator=gen, dtype=torch.float64).softmax(-1)
    else:
        t = torch.randn(shape, generator=gen, dtype=torch.float64)
    return t.to(torch_dtype(dtype))


def parameter_tensors(program: Program, device: str = "cpu", seed: int = 1234) -> dict[str, torch.Tensor]:
    """Parameters and constants by value id; ones saved without data are drawn (deterministically).
    Refused (memory_check.DoesNotFit) when they and the values a run computes cannot fit on `device`."""
    require_fits(program, device, parts=("parameters", "computed"))
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for v in program.values.values():
        if v.role not in (Role.PARAMETER, Role.CONSTANT):
            continue
        arr = program.data.get(v.id)
        if arr is None:   # small weights; integer ones (indices, buckets) stay integers
            t = draw(v.shape, v.dtype, None, gen)
            out[v.id] = (t * 0.1 if t.is_floating_point() else t).to(device)
        else:
            out[v.id] = torch.from_numpy(np.ascontiguousarray(arr)).to(torch_dtype(v.dtype)).to(device)
    return out


def bind_inputs(program: Program, inputs) -> dict[str, torch.Tensor]:
    """Map inputs (a list in call order, or a dict by name or value id) to value ids, checking shapes."""
    if isinstance(inputs, Mapping):
        bound = {}
        for vid in program.inputs:
            v = program.values[vid]
            if v.name in inputs:
                bound[vid] = inputs[v.name]
            elif vid in inputs:
                bound[vid] = inputs[vid]
            else:
                raise ProgramError(f"missing input '{v.name}'", value_id=vid)
    else:
        inputs = list(inputs)
        if len(inputs) != len(program.inputs):
            raise ProgramError(f"the program takes {len(program.inputs)} inputs, got {len(inputs)}")
        bound = dict(zip(program.inputs, inputs))
    for vid, t in bound.items():
        v = program.values[vid]
        if tuple(t.shape) != tuple(v.shape):
            raise ProgramError(f"input '{v.name}' must have shape {list(v.shape)}, got {list(t.shape)}",
                               value_id=vid)
    return bound


def run_node(program: Program, node_id: str, env: dict[str, torch.Tensor]) -> None:
    """Evaluate one node, reading its inputs from env (by value id) and writing its outputs there."""
    node = program.nodes[node_id]
    args = [env[v] if v is not None else None for v in node.inputs]
    result = node.opdef.reference(args, node.attrs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(results) < len(node.outputs):
        raise ProgramError(f"{node.name} ({node.op}) returned {len(results)} outputs, "
                           f"expected {len(node.outputs)}", node_id=node_id)
    for vid, t in zip(node.outputs, results):
        env[vid] = t


def run_reference(program: Program, inputs, *, device: str | None = None,
                  params: dict[str, torch.Tensor] | None = None,
                  order: Iterable[str] | None = None, keep: bool = False) -> dict[str, torch.Tensor]:
    """Run the program; returns outputs by name (or every value by id when keep=True)."""
    bound = bind_inputs(program, inputs)
    if device is None:
        device = next((str(t.device) for t in bound.values()), "cpu")
    env: dict[str, torch.Tensor] = dict(params if params is not None else parameter_tensors(program, device))
    env.update({vid: t.to(device) for vid, t in bound.items()})
    with torch.no_grad():
        for nid in (order if order is not None else program.topo_order()):
            run_node(program, nid, env)
    if keep:
        return env
    return {program.values[v].name: env[v] for v in program.outputs}
