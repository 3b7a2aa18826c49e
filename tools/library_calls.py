"""What the library-call probes (conv_layout_probe, tf32x3_probe, conv_tf32_layout_probe) share: every
matmul or convolution of some program files with a random input and the program's own weights, an L2
flush for timing, errors in units of the 1e-4 tolerance, and the rows written as JSON."""
from __future__ import annotations

import json
import os

import torch

from agent_core.importers import import_file
from agent_core.reference import parameter_tensors

FLUSH_BYTES = 256 * 2**20  # larger than the H200's 60 MB L2


def flusher():
    """A function that evicts the L2 (by writing a buffer larger than it)."""
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda").zero_


def library_calls(files, want, unique_shapes: bool = False, device: str = "cuda"):
    """(problem, program, node, a, w, bias) for every node with want(node) in the files: a random input,
    the program's weight (random when it is not a parameter) and bias. unique_shapes: each op, shape
    and attributes once. A file that does not import is reported and skipped."""
    seen = set()
    for path in files:
        try:
            program = import_file(path)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"{path}: import failed: {exc}", flush=True)
            continue
        params = parameter_tensors(program, device)
        for node in program.nodes.values():
            if not want(node):
                continue
            shapes = [tuple(program.values[v].shape) for v in node.inputs[:2]]
            key = (node.op, *shapes, json.dumps(node.attrs, sort_keys=True))
            if unique_shapes and key in seen:   # level 2 repeats shapes
                continue
            seen.add(key)
            w = params.get(node.inputs[1])
            bias = params.get(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
            yield (os.path.basename(path)[:-3], program, node, torch.randn(shapes[0], device=device),
                   w if w is not None else torch.randn(shapes[1], device=device), bias)


def exact_result(node, a, w, bias):
    """The node's result in float64, the yardstick for errors."""
    return node.opdef.reference([a.double(), w.double(), bias.double() if bias is not None else None], node.attrs)


def tolerance_units(got, exact) -> float:
    """Worst |got - exact| / (1e-4 + 1e-4 |exact|): below 1 passes KernelBench's check."""
    return float(((got.double() - exact).abs() / (1e-4 + 1e-4 * exact.abs())).max())


def write_rows(path: str | None, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
