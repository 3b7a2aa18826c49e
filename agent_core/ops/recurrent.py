"""Recurrent nets: the multi-layer, optionally bidirectional RNN (tanh or relu), LSTM and GRU of
torch.nn, each as one library node that runs through torch (cuDNN on a GPU, oneDNN or ATen on the CPU).

Ports follow aten.lstm.input / aten.gru.input / aten.rnn_tanh.input: the sequence, the initial hidden
state (and, for the LSTM, the initial cell state; unconnected means zeros, as torch.nn does), then the
weights in the order torch.nn keeps them (module._flat_weights): for each layer, for each direction,
w_ih, w_hh, then b_ih, b_hh when `bias`, then w_hr when the LSTM has a projection.

Output shapes come from this shape rule, never from what a tracer recorded: torch.export recorded
h_n and c_n of an LSTM with an extra dimension on torch <= 2.12 (pytorch#151200; the importer repairs
the traced metadata with `output_specs` below).
"""
from __future__ import annotations

import torch

from ..errors import ShapeError
from .common import fmt_shape
from .registry import FLOAT_DTYPES, Attr, OpDef, TensorSpec, register

GATES = {"rnn": 1, "lstm": 4, "gru": 3}          # weight rows per hidden unit
STATES = {"rnn": 1, "lstm": 2, "gru": 1}         # initial-state ports before the weights
_ATEN = {"lstm": "lstm", "gru": "gru", ("rnn", "tanh"): "rnn_tanh", ("rnn", "relu"): "rnn_relu"}


def weights_per_cell(op: str, attrs: dict) -> int:
    """How many weight tensors one layer and direction holds."""
    return 2 + 2 * bool(attrs["bias"]) + (op == "lstm" and attrs.get("proj_size", 0) > 0)


def weight_names(op: str, attrs: dict) -> list[str]:
    """The weights' names in port order, as torch.nn names its parameters (weight_ih_l0_reverse, ...)."""
    names = []
    for layer in range(attrs["num_layers"]):
        for suffix in ("", "_reverse")[:1 + bool(attrs["bidirectional"])]:
            cell = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if attrs["bias"] else [])
            if op == "lstm" and attrs.get("proj_size", 0) > 0:
                cell.append("weight_hr")
            names += [f"{n}_l{layer}{suffix}" for n in cell]
    return names


def _want_weight_shapes(op: str, attrs: dict, input_size: int) -> list[tuple[int, ...]]:
    h, dirs = attrs["hidden_size"], 1 + bool(attrs["bidirectional"])
    proj = attrs.get("proj_size", 0) if op == "lstm" else 0
    out = proj or h
    rows = GATES[op] * h
    shapes = []
    for layer in range(attrs["num_layers"]):
        cols = input_size if layer == 0 else out * dirs
        for _ in range(dirs):
            cell = [(rows, cols), (rows, out)] + ([(rows,), (rows,)] if attrs["bias"] else [])
            if proj:
                cell.append((proj, h))
            shapes += cell
    return shapes


def output_specs(op: str, attrs: dict, x: TensorSpec) -> list[TensorSpec]:
    """(output, h_n[, c_n]) for an input sequence x: output is [T, B, D * out] ([B, T, D * out] with
    batch_first), h_n [L * D, B, out], c_n [L * D, B, hidden], where out is proj_size or hidden_size."""
    h, dirs, layers = attrs["hidden_size"], 1 + bool(attrs["bidirectional"]), attrs["num_layers"]
    proj = attrs.get("proj_size", 0) if op == "lstm" else 0
    out = proj or h
    t, b = (x.shape[1], x.shape[0]) if attrs["batch_first"] else (x.shape[0], x.shape[1])
    seq = (b, t, dirs * out) if attrs["batch_first"] else (t, b, dirs * out)
    specs = [TensorSpec(seq, x.dtype), TensorSpec((layers * dirs, b, out), x.dtype)]
    if op == "lstm":
        specs.append(TensorSpec((layers * dirs, b, h), x.dtype))
    return specs


def _infer(op: str):
    def infer(ins, a):
        x = ins[0]
        if x.rank != 3:
            raise ShapeError(f"{op}: input must be a 3-D sequence ({'[batch, seq, features]' if a['batch_first'] else '[seq, batch, features]'}), got {fmt_shape(x.shape)}")
        if x.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: input must be a floating-point tensor, got {x.dtype}")
        if a["hidden_size"] < 1 or a["num_layers"] < 1:
            raise ShapeError(f"{op}: hidden_size and num_layers must be positive, got {a['hidden_size']} "
                             f"and {a['num_layers']}")
        if op == "lstm" and not 0 <= a["proj_size"] < a["hidden_size"]:
            raise ShapeError(f"lstm: proj_size must be at least 0 and below hidden_size ({a['hidden_size']}), "
                             f"got {a['proj_size']}")
        specs = output_specs(op, a, x)
        n_states = STATES[op]
        states, weights = (list(ins[1:1 + n_states]) + [None] * n_states)[:n_states], ins[1 + n_states:]
        for k, (s, want) in enumerate(zip(states, specs[1:])):
            if s is not None and (s.shape != want.shape or s.dtype != x.dtype):
                what = ("h0", "c0")[k]
                raise ShapeError(f"{op}: {what} must be {want} for input {x}, got {s}")
        shapes = _want_weight_shapes(op, a, x.shape[2])
        names = weight_names(op, a)
        if len(weights) != len(shapes) or any(w is None for w in weights):
            cells = a["num_layers"] * (1 + bool(a["bidirectional"]))
            raise ShapeError(f"{op}: {cells} layer-direction cell{'s' if cells != 1 else ''} need "
                             f"{len(shapes)} weights ({', '.join(names[:weights_per_cell(op, a)])}, ...), "
                             f"got {len([w for w in weights if w is not None])}")
        for name, w, want in zip(names, weights, shapes):
            if w.shape != want or w.dtype != x.dtype:
                raise ShapeError(f"{op}: {name} must be {TensorSpec(want, x.dtype)}, got {w}")
        return specs
    return infer


def _reference(op: str):
    def reference(ts, a):
        x = ts[0]
        n_states = STATES[op]
        states = (list(ts[1:1 + n_states]) + [None] * n_states)[:n_states]
        weights = list(ts[1 + n_states:])
        specs = output_specs(op, a, TensorSpec(tuple(x.shape), "float32"))
        hx = [s if s is not None else torch.zeros(spec.shape, dtype=x.dtype, device=x.device)
              for s, spec in zip(states, specs[1:])]
        fn = getattr(torch.ops.aten, _ATEN[op] if op != "rnn" else _ATEN[("rnn", a["nonlinearity"])]).input
        # eval semantics: dropout between layers is off, as in module.eval()
        args = (bool(a["bias"]), a["num_layers"], 0.0, False, bool(a["bidirectional"]), bool(a["batch_first"]))
        if op == "lstm":
            return tuple(fn(x, hx, weights, *args))
        return tuple(fn(x, hx[0], weights, *args))
    return reference


def _flops(op: str):
    def flops(ins, outs, a):
        x = ins[0]
        t, b = (x.shape[1], x.shape[0]) if a["batch_first"] else (x.shape[0], x.shape[1])
        dirs, h = 1 + bool(a["bidirectional"]), a["hidden_size"]
        out = (a.get("proj_size", 0) if op == "lstm" else 0) or h
        total, cols = 0, x.shape[2]
        for _ in range(a["num_layers"]):
            per_step = 2 * GATES[op] * h * (cols + out) + (2 * out * h if out != h else 0)
            total += dirs * t * b * per_step
            cols = dirs * out
        return total
    return flops


def _attrs(op: str) -> tuple[Attr, ...]:
    common = (Attr("hidden_size", "int", doc="features of the hidden state"),
              Attr("num_layers", "int", 1, doc="stacked layers"),
              Attr("bias", "bool", True, doc="b_ih and b_hh per layer and direction"),
              Attr("batch_first", "bool", False, doc="input and output are [batch, seq, features]"),
              Attr("bidirectional", "bool", False, doc="a reverse pass too, concatenated on features"))
    if op == "rnn":
        return (Attr("nonlinearity", "str", "tanh", choices=("tanh", "relu")),) + common
    if op == "lstm":
        return common + (Attr("proj_size", "int", 0, doc="h_t projected to this size (0: none)"),)
    return common


def _register(op: str, inputs: tuple[str, ...], outputs: tuple[str, ...], doc: str, example, bad) -> None:
    register(OpDef(op, "recurrent", inputs, _infer(op), _reference(op), attrs=_attrs(op), outputs=outputs,
                   flops=_flops(op), doc=doc, extra={"example": example, "bad": bad}))


# example: 2 layers, bidirectional, batch 2, sequence 3, 4 input features, hidden 5
def _example(op: str, proj: int = 0):
    a = {"hidden_size": 5, "num_layers": 2, "bidirectional": True}
    if proj:
        a["proj_size"] = proj
    full = {"bias": True, "batch_first": False, "proj_size": proj, **a}
    out = proj or 5
    states = [(4, 2, out)] + ([(4, 2, 5)] if op == "lstm" else [])
    return ([(3, 2, 4)] + states + _want_weight_shapes(op, full, 4), a)


_register("rnn", ("input", "h0?", "weights*"), ("output", "h_n"),
          "Elman RNN (torch.nn.RNN): h_t = tanh or relu(x_t W_ih^T + b_ih + h_(t-1) W_hh^T + b_hh); "
          "runs through torch (cuDNN)",
          _example("rnn"), ([(3, 2, 4), (4, 2, 6)], {"hidden_size": 5, "num_layers": 2, "bidirectional": True},
                            "h0 must be"))
_register("lstm", ("input", "h0?", "c0?", "weights*"), ("output", "h_n", "c_n"),
          "long short-term memory (torch.nn.LSTM), optional projection; runs through torch (cuDNN)",
          _example("lstm", proj=3), ([(3, 2, 4)], {"hidden_size": 5}, "need 4 weights"))
_register("gru", ("input", "h0?", "weights*"), ("output", "h_n"),
          "gated recurrent unit (torch.nn.GRU); runs through torch (cuDNN)",
          _example("gru"), ([(3, 4)], {"hidden_size": 5}, "3-D sequence"))


_CUDNN_MODES = {"lstm": "LSTM", "gru": "GRU", ("rnn", "tanh"): "RNN_TANH", ("rnn", "relu"): "RNN_RELU"}


def flatten_for_cudnn(program, node, tensors: dict) -> bool:
    """Put a recurrent node's weights (tensors: value id -> the caller's own CUDA copies) into one buffer
    in cuDNN's layout, as torch.nn's flatten_parameters does; they become views of it. Else every
    call copies them into a new buffer first: a temporary the size of all the weights (35_LSTM: 12 MiB
    above eager's peak) and a copy kernel per call. False where it does not apply."""
    import torch
    a = node.attrs
    ws = [tensors.get(v) for v in node.inputs[1 + STATES[node.op]:]]
    if not ws or any(w is None or not w.is_cuda or w.dtype != ws[0].dtype for w in ws) or \
            len({w.data_ptr() for w in ws}) != len(ws) or not torch._use_cudnn_rnn_flatten_weight():
        return False
    from torch.backends.cudnn import rnn
    mode = rnn.get_cudnn_mode(_CUDNN_MODES[node.op if node.op != "rnn" else ("rnn", a["nonlinearity"])])
    with torch.no_grad():
        torch._cudnn_rnn_flatten_weight(ws, weights_per_cell(node.op, a), program.values[node.inputs[0]].shape[2],
                                        mode, a["hidden_size"], a.get("proj_size", 0) if node.op == "lstm" else 0,
                                        a["num_layers"], bool(a["batch_first"]), bool(a["bidirectional"]))
    return True
