"""import_nn_module: an nn.Module and example inputs become a Program."""
from __future__ import annotations

import inspect

import torch

from ..errors import ImportFailure
from ..ir import Program
from .graph import check_imported, convert_graph
from .hints import init_hint
from .trace import trace


def forward_arg_names(module: torch.nn.Module, n: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params][:n]
    except (TypeError, ValueError):
        names = []
    return names + [f"input{k}" for k in range(len(names), n)]


def import_nn_module(module: torch.nn.Module, example_inputs, *, name: str = "model",
                     hints: list | None = None, copy_weights: bool = True) -> Program:
    """Trace `module` (in eval mode) on example_inputs and build the Program.

    example_inputs: forward's positional arguments. Tensors become program inputs (real, fake or
    meta tensors: only real ones give data-derived init hints, unless `hints` gives them per
    argument); other values (ints, floats) are baked into the program as constants.
    copy_weights=False: the program's parameters share the module's weight memory (for a module made
    only to be imported); by default they are copies, untouched by later changes to the module.
    """
    if not isinstance(module, torch.nn.Module):
        raise ImportFailure(f"expected a torch.nn.Module, got {type(module).__name__}")
    args = list(example_inputs) if isinstance(example_inputs, (list, tuple)) else [example_inputs]
    module.eval()
    gm, places, outs, method = trace(module, args)
    arg_names = forward_arg_names(module, len(args))
    ph_names = {spec[1]: ph for ph, spec in places.items() if spec[0] == "input"}
    resolved = {}
    for ph, spec in places.items():
        if spec[0] == "input":
            k = spec[1]
            hint = hints[k] if hints is not None and k < len(hints) else init_hint(args[k])
            label = ph if method == "torch.export" else arg_names[k]
            resolved[ph] = ("input", label, hint)
        else:
            resolved[ph] = spec
    program = Program(name)
    cx = convert_graph(program, gm, resolved, outs, copy_weights=copy_weights)
    by_name = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    template, baked = [], {}
    for k, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            ph = ph_names.get(k)
            vid = cx.env.get(by_name[ph]) if ph in by_name else None
            if vid is None:
                raise ImportFailure(f"forward argument {arg_names[k]} did not become a program input")
            template.append({"input": program.values[vid].name})
        else:
            template.append({"const": a})
            baked[arg_names[k]] = a
    program.metadata.update({"import_method": method, "forward_args": template, "baked_inputs": baked})
    if method != "torch.export":
        program.metadata["import_warnings"].insert(
            0, f"torch.export could not trace the model; imported through {method} instead")
    check_imported(program)  # blocked opaque placeholders stay, as the user's error to see
    return program
