"""Tracing a module to an aten-level FX graph.

The main path is torch.export.export(strict=False) on the eval-mode module: non-strict export runs
forward in Python (no TorchDynamo bytecode analysis), and its default IR is the pre-dispatch /
training IR, which keeps high-level aten ops (aten.linear, aten.conv2d, aten.layer_norm,
aten.softmax.int, aten.gelu with its approximate argument) that map one-to-one to library ops.
If export refuses the module, we fall back to make_fx (the proxy-tensor tracer that torch.fx
offers) at the same pre-dispatch level, which checks less (no guards, no graph-break analysis).
Both trace with fake tensors when the example inputs are fake or meta, so nothing is computed.
"""
from __future__ import annotations

import warnings

import torch
import torch.fx as fx
from torch.export.graph_signature import InputKind, OutputKind

from ..errors import ImportFailure
from .packages import missing_package
from .recurrent_meta import shape_rule_tracing


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def trace(module: torch.nn.Module, args: list, input_names: list[str] | None = None):
    """(graph module, placeholders, user-output indices, method).

    placeholders maps a placeholder name to ("input", arg index) | ("parameter", name, tensor) |
    ("constant", name, tensor) | ("baked", value).
    """
    try:
        with torch.no_grad(), warnings.catch_warnings(), shape_rule_tracing():
            warnings.simplefilter("ignore", UserWarning)  # export's advice to module authors (e.g. LSTM's flat weights)
            ep = torch.export.export(module, tuple(args), strict=False)
        return _from_export(ep, args) + ("torch.export",)
    except ImportFailure:
        raise
    except Exception as export_error:
        missing = missing_package(export_error, "the model's forward")
        if missing:
            raise ImportFailure(missing) from None
        try:
            return _from_make_fx(module, args) + ("make_fx",)
        except Exception:
            raise ImportFailure(f"torch.export could not trace the model ({_first_line(export_error)}), "
                                f"and neither could the make_fx fallback") from export_error


def _from_export(ep, args):
    sig = ep.graph_signature
    places: dict[str, tuple] = {}
    user = 0
    for spec in sig.input_specs:
        name = getattr(spec.arg, "name", None)
        if spec.kind == InputKind.USER_INPUT:
            if name is not None:
                places[name] = ("input", user) if isinstance(args[user], torch.Tensor) else ("baked", args[user])
            user += 1
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            data = ep.state_dict.get(spec.target)
            if data is None:
                data = ep.constants.get(spec.target)
            places[name] = ("parameter", spec.target, data)
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            places[name] = ("constant", spec.target, ep.constants.get(spec.target))
        else:
            raise ImportFailure(f"the exported model takes a {spec.kind.name.lower()} input, which a program cannot hold")
    outs = [i for i, s in enumerate(sig.output_specs) if s.kind == OutputKind.USER_OUTPUT]
    return ep.graph_module, places, outs


def _from_make_fx(module, args):
    from torch.fx.experimental.proxy_tensor import make_fx

    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    names = list(state)

    def f(*flat):
        return torch.func.functional_call(module, dict(zip(names, flat[:len(names)])), tuple(flat[len(names):]))

    with torch.no_grad(), shape_rule_tracing():
        gm: fx.GraphModule = make_fx(f, tracing_mode="fake", pre_dispatch=True)(*state.values(), *args)
    places: dict[str, tuple] = {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, n in enumerate(phs):
        if k < len(names):
            places[n.name] = ("parameter", names[k], state[names[k]])
        else:
            a = args[k - len(names)]
            places[n.name] = ("input", k - len(names)) if isinstance(a, torch.Tensor) else ("baked", a)
    return gm, places, None
