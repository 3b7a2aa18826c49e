"""Exact output shapes for the recurrent aten ops in a traced graph.

torch.export runs aten.lstm.input through a Python decomposition to learn its output shapes, and on
torch <= 2.12 that decomposition returned each layer's h and c with an extra dimension, so the traced
graph says h_n and c_n are [L * D, 1, B, H] while the real op returns [L * D, B, H]
(pytorch#151200). Every shape the importer takes from the graph (the check of each converted node,
an opaque node's out_specs, a reshape's target) would inherit the error: the KernelBench LSTM
problems then failed when the reference ran ("output 1 is float32[6, 10, 256] but out_specs says
float32[6, 1, 10, 256]").

shape_rule_tracing() makes tracing compute those results from the library's shape rule in the first
place (and fast); repair() is the check after it, for a torch whose kernels it could not replace: it
sets the recurrent nodes' recorded results to the library's shape rule
(agent_core/ops/recurrent.py, torch.nn's documented contract) and, where one changed, propagates the
new shapes to every node that depends on it by running those nodes again on fake tensors.
"""
from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor

from ..ops.common import dtype_name, torch_dtype
from ..ops.recurrent import output_specs
from ..ops.registry import TensorSpec

# aten overload -> (library op, number of hidden-state tensors in hx)
RECURRENT = {"lstm.input": "lstm", "gru.input": "gru", "rnn_tanh.input": "rnn", "rnn_relu.input": "rnn"}


def recurrent_op(target) -> str | None:
    """'lstm' / 'gru' / 'rnn' for a recurrent aten overload, else None."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
        return None
    return RECURRENT.get(f"{target._schema.name.split('::')[-1]}.{target._overloadname}")


def _val_spec(t) -> TensorSpec:
    return TensorSpec(tuple(int(d) for d in t.shape), dtype_name(t.dtype))


def _specs(op: str, x, states: list, bias, layers, bidir, batch_first) -> list[TensorSpec]:
    """The library's shape rule for one call, from its tensors' shapes (real, fake or recorded)."""
    hidden = int(states[-1].shape[-1])
    attrs = {"hidden_size": hidden, "num_layers": int(layers), "bias": bool(bias), "bidirectional": bool(bidir),
             "batch_first": bool(batch_first)}
    if op == "lstm":
        out = int(states[0].shape[-1])
        attrs["proj_size"] = out if out != hidden else 0
    return output_specs(op, attrs, _val_spec(x))


def exact_specs(n: fx.Node) -> list[TensorSpec] | None:
    """The outputs of recurrent node n by the library's shape rule (None when n is not one, or its
    arguments carry no recorded shapes)."""
    op = recurrent_op(n.target)
    if op is None:
        return None
    # (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
    x, hx, _params, bias, layers, _p, _train, bidir, batch_first = n.args[:9]
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    vals = [s.meta.get("val") if isinstance(s, fx.Node) else None for s in [x] + states]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    return _specs(op, vals[0], vals[1:], bias, layers, bidir, batch_first)


# where torch registers the Python decomposition (torch/_decomp/decompositions.py: lstm_impl, gru_impl, ...)
_KEYS = (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd)


@contextlib.contextmanager
def shape_rule_tracing():
    """While a model is traced, the recurrent aten ops compute their fake results from the shape rule
    instead of through torch's Python decomposition, which steps through every time step of every
    layer on fake tensors (a 6-layer bidirectional GRU over 512 steps: 22 s of a 23 s export) and
    recorded wrong LSTM state shapes on older torch. Only tracing reaches these kernels (they are
    the ops' CompositeImplicitAutograd and Autograd Python kernels); eager calls run torch's own."""
    swapped = []
    try:
        for name, op in RECURRENT.items():
            packet, overload = name.split(".")
            overload_op = getattr(getattr(torch.ops.aten, packet), overload)
            for key in _KEYS:
                saved = overload_op.py_kernels.get(key)
                if saved is None:       # a torch without this Python kernel: nothing to replace
                    continue
                overload_op.py_kernels[key] = _shape_kernel(op, saved)
                swapped.append((overload_op, key, saved))
            overload_op._dispatch_cache.clear()
        yield
    finally:
        for overload_op, key, saved in swapped:
            overload_op.py_kernels[key] = saved
            overload_op._dispatch_cache.clear()


def _shape_kernel(op: str, saved):
    def kernel(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        if not all(isinstance(t, FakeTensor) or t.device.type == "meta" for t in [input] + states):
            return saved(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        specs = _specs(op, input, states, has_biases, num_layers, bidirectional, batch_first)
        return tuple(input.new_empty(s.shape) for s in specs)
    return kernel


def repair(gm: fx.GraphModule) -> list[str]:
    """Correct the recorded shapes of recurrent nodes and of everything computed from them; returns
    one line per corrected recurrent node (for the import warnings)."""
    changed: set[fx.Node] = set()
    notes: list[str] = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        val = n.meta.get("val")
        want = exact_specs(n)
        if want is not None and isinstance(val, (tuple, list)) and len(val) >= len(want):
            got = [_val_spec(v) for v in val[:len(want)]]
            if got != want:
                mode = val[0].fake_mode if hasattr(val[0], "fake_mode") else None
                n.meta["val"] = type(val)(_fresh(s, v, mode) for s, v in zip(want, val)) + type(val)(val[len(want):])
                changed.add(n)
                notes.append(f"{n.target}: node {n.name}: torch recorded its results as "
                             f"{', '.join(map(str, got))}; the op returns {', '.join(map(str, want))} "
                             f"(pytorch#151200), which the import uses")
            continue
        if any(a in changed for a in n.all_input_nodes) and _rerun(n):
            changed.add(n)
    return notes


def _fresh(spec: TensorSpec, like: torch.Tensor, mode):
    """A tensor of spec's shape made like `like` (a fake tensor in the trace's fake mode, or meta)."""
    if mode is not None:
        with mode:
            return torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=like.device)
    return torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device="meta")


def _rerun(n: fx.Node) -> bool:
    """Recompute n's recorded result from its inputs' (corrected) results; False where it cannot run
    (its record is then left as it was: a converter that disagrees falls back to opaque)."""
    def value(a):
        return a.meta.get("val") if isinstance(a, fx.Node) else a

    args = fx.node.map_aggregate(n.args, value)
    kwargs = fx.node.map_aggregate(n.kwargs, value)
    if n.target is operator.getitem:
        n.meta["val"] = args[0][args[1]]
        return True
    if not callable(n.target):
        return False
    mode = next((t.fake_mode for t in _tensors(args, kwargs) if hasattr(t, "fake_mode")), None)
    try:
        if mode is not None:
            with mode:
                n.meta["val"] = n.target(*args, **kwargs)
        else:
            n.meta["val"] = n.target(*args, **kwargs)
    except Exception:
        return False
    return True


def _tensors(args, kwargs) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def visit(x):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)
        elif isinstance(x, dict):
            for y in x.values():
                visit(y)

    visit(args)
    visit(kwargs)
    return out
