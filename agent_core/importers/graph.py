"""Turn an aten-level FX graph (from torch.export or make_fx) into a Program.

Placeholders become program inputs, parameters (weights and buffers) and constants; each call node
goes through the aten_map table; whatever the table cannot express becomes an `opaque` node that
runs the aten op itself through torch, and is listed in program.metadata["import_warnings"]. An op
the opaque policy refuses (ops/operator_policy.py: random, in-place, file or device ops...) becomes
a `blocked` opaque placeholder instead: visible, with its reason as the node's error, never called.
Every mapped result is checked against the shape and dtype torch recorded for the node, so a
converter that gets an op wrong degrades to opaque instead of producing a wrong program.
"""
from __future__ import annotations

import operator
from collections import Counter
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from ..errors import ImportFailure, ProgramError, ShapeError, StitchError
from ..ir import Program
from ..ops import REGISTRY, TensorSpec
from ..ops.common import dtype_name
from ..ops.operator_policy import OperatorRefused, resolve_overload
from . import complex_pairs
from .aten_map import Unmapped, lookup
from .module_paths import note_module
from .recurrent_meta import repair as repair_recurrent_meta

# Factory ops inside forward make a tensor from nothing: evaluate them once into a constant.
_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn", "randint",
              "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like",
              "scalar_tensor", "tensor", "new_zeros", "new_ones", "new_full", "new_empty", "normal",
              "bernoulli", "uniform"}
_RANDOM = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal", "bernoulli",
           "uniform"}
_CONSTANT_LIMIT = 1 << 26  # elements; a bigger constant made in forward stays an opaque node


def to_numpy(t: torch.Tensor, copy: bool = True) -> np.ndarray:
    """A copy: the program owns its data, later changes to the module's weights do not leak in. With
    copy=False the array shares the tensor's memory where it can (for a module no one else holds)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    arr = t.contiguous().numpy()
    return arr.copy() if copy else arr


def _spec_of(val) -> TensorSpec:
    return TensorSpec(tuple(int(d) for d in val.shape), dtype_name(val.dtype))


def _aten_name(target) -> str:
    """'aten.add.Tensor' for an OpOverload; the Python name for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def _bind(target, args, kwargs) -> dict:
    """Arguments by schema name, defaults filled in."""
    out = {}
    pos = list(args)
    for arg in target._schema.arguments:
        if pos and not arg.kwarg_only:
            out[arg.name] = pos.pop(0)
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


class Converter:
    """Holds the program being built and the FX-node -> value-id environment."""

    def __init__(self, program: Program):
        self.program = program
        self.env: dict[fx.Node, Any] = {}
        self.warnings: list[str] = []
        self.opaque: Counter = Counter()
        self.node: fx.Node | None = None
        self.pairs: set[str] = set()      # values holding a complex tensor as float pairs (complex_pairs.py)

    # values ------------------------------------------------------------------------------
    def is_tensor(self, x) -> bool:
        """x is an FX node holding a tensor, or already a value id."""
        if isinstance(x, str):
            return x in self.program.values
        return isinstance(x, fx.Node) and isinstance(self.env.get(x), str)

    def vid(self, x) -> str | None:
        if x is None:
            return None
        if isinstance(x, str):
            return x
        if isinstance(x, fx.Node):
            v = self.env.get(x)
            if isinstance(v, str):
                return v
            raise Unmapped(f"input {x.name} is not a tensor")
        raise Unmapped(f"expected a tensor, got {type(x).__name__} {x!r}")

    def spec(self, x) -> TensorSpec:
        return self.program.values[self.vid(x)].spec

    def meta_shape(self, n: fx.Node) -> tuple:
        return tuple(int(d) for d in n.meta["val"].shape)

    def meta_dtype(self, n: fx.Node) -> str:
        return dtype_name(n.meta["val"].dtype)

    def constant(self, name: str, data: np.ndarray, dtype: str | None = None) -> str:
        return self.program.add_parameter(name, np.asarray(data), dtype=dtype, constant=True).id

    def tensor(self, x, like=None, dtype: str | None = None) -> str:
        """A value id for x; a Python number becomes a 0-d constant of dtype (or like's dtype)."""
        if isinstance(x, (fx.Node, str)):
            return self.vid(x)
        if isinstance(x, (bool, int, float)):
            if dtype is None:
                base = self.spec(like).dtype if like is not None else "float32"
                dtype = base if not (isinstance(x, float) and base not in ("float32", "float64", "float16",
                                                                          "bfloat16")) else "float32"
            arr = np.asarray(x, dtype=np.float32 if dtype == "bfloat16" else np.dtype(dtype))
            return self.constant(f"scalar_{x}", arr, dtype)
        raise Unmapped(f"cannot make a tensor from {type(x).__name__}")

    def alias(self, x) -> str:
        return self.vid(x)

    # emitting ----------------------------------------------------------------------------
    def emit(self, op: str, inputs: list, attrs: dict | None = None):
        if op not in REGISTRY:
            raise Unmapped(f"the library has no op '{op}'")
        ids = [self.vid(x) for x in inputs]
        while ids and ids[-1] is None:
            ids.pop()
        node = self.program.add_node(op, ids, attrs or {})
        return node.outputs[0] if len(node.outputs) == 1 else list(node.outputs)

    def cast_to(self, x, dtype: str) -> str:
        if self.spec(x).dtype == dtype:
            return self.vid(x)
        return self.emit("cast", [x], {"dtype": dtype})

    def pointwise(self, n: fx.Node, op: str, inputs: list, attrs: dict | None = None, cast: bool = True):
        """A pointwise op, with torch's implicit promotion made explicit: tensor inputs are cast to
        the result dtype torch recorded (int tensor * 0.5 computes in float)."""
        if cast:
            dt = self.meta_dtype(n)
            inputs = [self.cast_to(x, dt) if self.is_tensor(x) else self.tensor(x, dtype=dt)
                      for x in inputs]
        return self.emit(op, inputs, attrs)

    def scaled(self, n: fx.Node, x, alpha):
        if self.is_tensor(x):
            return self.pointwise(n, "mul_scalar", [x], {"value": alpha})
        return x * alpha

    # the conversion ------------------------------------------------------------------------
    def call(self, n: fx.Node) -> None:
        self.node = n
        if n.target is operator.getitem:
            src = self.env[n.args[0]]
            self.env[n] = src[n.args[1]]
            if isinstance(src, list) and self.env[n] is None and n.users:
                raise ImportFailure(f"{n.name}: output {n.args[1]} of {n.args[0].name} was not produced")
            return
        name = _aten_name(n.target)
        if n.meta.get("val") is None and not n.users:  # checks with no result (_assert_tensor_metadata)
            self.env[n] = None
            return
        if not isinstance(n.target, torch._ops.OpOverload):
            self.env[n] = self._opaque(n, name, f"{name} is not an aten op")
            return
        base = name.split(".")[1]
        fbase = base[:-1] if base.endswith("_") else base
        if fbase in _FACTORIES and (not n.all_input_nodes or fbase.endswith("_like") or fbase.startswith("new_")
                                    or fbase in _RANDOM):
            self.env[n] = self._factory(n, name, fbase)
            return
        paired = complex_pairs.handles(self, n)
        conv = lookup(name)
        if conv is None and not paired:
            self.env[n] = self._opaque(n, name, "no library op for it")
            return
        nodes_before, values_before = set(self.program.nodes), set(self.program.values)
        try:
            if paired:
                self.env[n] = complex_pairs.convert(self, n, _bind(n.target, n.args, n.kwargs))
                return
            if any(complex_pairs.is_complex(x) for x in n.all_input_nodes):
                raise Unmapped("it reads a complex value, which the library ops do not compute with")
            result = conv(self, n, _bind(n.target, n.args, n.kwargs))
            self.env[n] = self._check(n, result)
            if base != fbase:
                self._note_in_place(self.env[n], nodes_before)
        except (Unmapped, ProgramError) as e:
            self._rollback(nodes_before, values_before)
            self.env[n] = self._opaque(n, name, str(e))

    def _note_in_place(self, vid, nodes_before) -> None:
        """An in-place aten op (relu_ of nn.ReLU(inplace=True)) becomes its functional op here, but eager
        torch writes its result over its input: the memory plan's estimate of eager's peak (the default
        budget) aliases the two (program.metadata["eager_in_place"], node ids)."""
        if not isinstance(vid, str):
            return
        nid = self.program.values[vid].producer
        node = self.program.nodes.get(nid) if nid is not None else None
        if node is None or nid in nodes_before or not node.inputs or node.inputs[0] is None:
            return
        if self.program.values[node.inputs[0]].spec == self.program.values[vid].spec:
            self.program.metadata.setdefault("eager_in_place", []).append(nid)

    def _check(self, n: fx.Node, result):
        """Compare with what torch recorded; cast on a dtype difference, refuse a shape difference."""
        val = n.meta.get("val")
        if isinstance(val, (list, tuple)):
            if not isinstance(result, list) or len(result) != len(val):
                raise Unmapped(f"expected {len(val)} outputs")
            return [None if r is None else self._check_one(r, v) for r, v in zip(result, val)]
        if isinstance(result, list):
            raise Unmapped("the library op makes several outputs where torch makes one")
        return self._check_one(result, val)

    def _check_one(self, vid: str, val) -> str:
        if not isinstance(val, torch.Tensor):
            raise Unmapped(f"torch's result is a {type(val).__name__}, not a tensor")
        want = _spec_of(val)
        got = self.program.values[vid].spec
        if got.shape != want.shape:
            raise Unmapped(f"the library gives shape {list(got.shape)}, torch {list(want.shape)}")
        if got.dtype != want.dtype:
            vid = self.emit("cast", [vid], {"dtype": want.dtype})
        return vid

    def _rollback(self, nodes_before: set, values_before: set) -> None:
        for nid in [k for k in self.program.nodes if k not in nodes_before]:
            if nid in self.program.nodes:
                self.program.remove_node(nid)
        for vid in [k for k in self.program.values if k not in values_before]:
            if vid in self.program.values and self.program.values[vid].producer is None:
                self.program.remove_value(vid)

    def _factory(self, n: fx.Node, name: str, base: str):
        """Evaluate a tensor factory once (seeded by the importer) into a constant value."""
        val = n.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.numel() > _CONSTANT_LIMIT:
            return self._opaque(n, name, "a large tensor created inside forward")

        def real(x):
            if isinstance(x, fx.Node):
                v = x.meta["val"]
                return torch.zeros(tuple(v.shape), dtype=v.dtype)
            return x

        args = fx.node.map_aggregate(n.args, real)
        kwargs = {k: (torch.device("cpu") if k == "device" else real(v)) for k, v in n.kwargs.items()}
        t = n.target(*args, **kwargs)
        if base in _RANDOM:
            self.warnings.append(f"{name}: a random tensor created inside forward is baked into the program "
                                 f"as a constant (the module draws a new one on every call)")
        return self.constant(n.name, to_numpy(t), dtype_name(t.dtype))

    # opaque --------------------------------------------------------------------------------
    def _opaque(self, n: fx.Node, name: str, why: str):
        inputs: list[str] = []

        def enc(x):
            if isinstance(x, fx.Node):
                v = self.env.get(x)
                if isinstance(v, str):
                    if v not in inputs:
                        inputs.append(v)
                    return {"input": inputs.index(v)}
                if isinstance(v, (int, float, bool)) or v is None:
                    return v
                raise ImportFailure(f"{n.name} ({name}) reads {x.name}, which is not a tensor")
            if isinstance(x, (list, tuple)):
                return [enc(y) for y in x]
            if isinstance(x, torch.dtype):
                return {"dtype": dtype_name(x)}
            if isinstance(x, torch.device):
                return None
            if isinstance(x, (torch.memory_format, torch.layout)):  # layout hints: the default is right
                return None
            if x is None or isinstance(x, (bool, int, float, str)):
                return x
            raise ImportFailure(f"{n.name} ({name}) has an argument of type {type(x).__name__} "
                                f"that a program cannot hold")

        args = enc(list(n.args))
        kwargs = {k: enc(v) for k, v in n.kwargs.items() if not isinstance(v, torch.device)}
        val = n.meta.get("val")
        vals = list(val) if isinstance(val, (list, tuple)) else [val]
        if not all(isinstance(v, torch.Tensor) for v in vals):
            raise ImportFailure(f"{n.name} ({name}) returns a non-tensor value; the program model holds tensors only")
        out_specs = [{"shape": list(_spec_of(v).shape), "dtype": _spec_of(v).dtype} for v in vals]
        attrs = {"target": name, "args": args, "kwargs": kwargs, "out_specs": out_specs}
        refused = self._refusal(n.target, args, kwargs)
        self.opaque[name] += 1
        if refused is None:
            node = self.program.add_node("opaque", inputs, attrs, name=n.name)
            self.warnings.append(f"{name}: runs as an opaque torch op (node {node.id}): {why}")
        else:
            node = self._placeholder(inputs, {**attrs, "blocked": refused}, out_specs, n.name)
            self.warnings.append(f"{name}: node {node.id} is a blocked placeholder that never runs: {refused}")
        return list(node.outputs) if isinstance(val, (list, tuple)) else node.outputs[0]

    @staticmethod
    def _refusal(target, args, kwargs) -> str | None:
        """Why the opaque policy refuses this call (None: it may run)."""
        if not isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return f"{_aten_name(target)} is not a torch operator"
        try:
            resolve_overload(target, args, kwargs)
        except OperatorRefused as e:
            return str(e)
        return None

    def _placeholder(self, inputs: list[str], attrs: dict, out_specs: list[dict], name: str):
        """A blocked opaque node: its inference raises the reason (the editor's error badge), so it is
        added unchecked and its outputs get the shapes torch recorded, which downstream nodes read."""
        node = self.program.add_node("opaque", inputs, attrs, name=name, strict=False)
        self.program._resize_outputs(node, len(out_specs))  # inference cannot say how many
        for vid, spec in zip(node.outputs, out_specs):
            v = self.program.values[vid]
            v.shape, v.dtype = tuple(spec["shape"]), spec["dtype"]
        return node


def convert_graph(program: Program, gm: fx.GraphModule, placeholders: dict[str, tuple], outputs: list[int] | None,
                  *, copy_weights: bool = True):
    """Fill `program` from gm's graph.

    placeholders: placeholder name -> ("input", name, init hint) | ("parameter", name, tensor or None) |
    ("constant", name, tensor) | ("baked", value) for a non-tensor user input.
    outputs: indices of the graph outputs that are user outputs (None: all).
    """
    cx = Converter(program)
    cx.warnings += repair_recurrent_meta(gm)   # before any shape is read from the graph
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            kind = placeholders.get(n.name, ("skip",))
            val = n.meta.get("val")
            if kind[0] == "baked" or not isinstance(val, torch.Tensor):
                cx.env[n] = kind[1] if kind[0] == "baked" else val
                continue
            if not n.users and kind[0] != "input":  # e.g. BatchNorm's num_batches_tracked
                continue
            spec = _spec_of(val)
            if kind[0] == "input":
                cx.env[n] = program.add_input(kind[1], spec.shape, spec.dtype, init=kind[2]).id
            elif kind[0] in ("parameter", "constant"):
                data = kind[2]
                is_const = kind[0] == "constant"
                if data is None or data.device.type == "meta":
                    cx.env[n] = program.add_parameter(kind[1], shape=spec.shape, dtype=spec.dtype,
                                                      constant=is_const).id
                else:
                    cx.env[n] = program.add_parameter(kind[1], to_numpy(data, copy_weights), dtype=spec.dtype,
                                                      constant=is_const).id
            else:
                raise ImportFailure(f"placeholder {n.name} is neither an input nor a parameter")
        elif n.op == "get_attr":
            t = getattr(gm, n.target)
            if isinstance(t, torch.Tensor):
                cx.env[n] = program.add_parameter(n.target, to_numpy(t), dtype=dtype_name(t.dtype)).id
            else:
                cx.env[n] = t
        elif n.op == "call_function":
            cx.call(n)
            note_module(program, n)
        elif n.op == "output":
            outs = n.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            if outputs is not None:
                outs = [outs[i] for i in outputs]
            _mark_outputs(cx, outs)
        else:
            raise ImportFailure(f"unexpected graph node {n.op} {n.target}")
    _drop_dead(program)
    program.metadata["import_warnings"] = cx.warnings
    program.metadata["opaque_ops"] = dict(cx.opaque)
    return cx


def check_imported(program: Program) -> None:
    """Program.check(), except for the blocked placeholders the import made on purpose: their error is
    the message the user sees on the canvas, and the import warnings already name them."""
    blocked = {nid for nid, n in program.nodes.items() if n.op == "opaque" and n.attrs.get("blocked") is not None}
    for d in program.validate():
        if d.severity == "error" and d.node_id not in blocked:
            cls = ShapeError if d.code == "shape" else ProgramError
            raise cls(d.message, node_id=d.node_id, value_id=d.value_id)


def _drop_dead(program: Program) -> None:
    """Remove nodes nothing reads (export keeps e.g. the unread index output of max.dim)."""
    while True:
        used = {v for n in program.nodes.values() for v in n.inputs if v} | set(program.outputs)
        dead = [nid for nid, n in program.nodes.items() if not any(v in used for v in n.outputs)]
        if not dead:
            return
        for nid in dead:
            program.remove_node(nid)


def _mark_outputs(cx: Converter, outs: list) -> None:
    program = cx.program
    for k, o in enumerate(outs):
        if not isinstance(o, fx.Node) or not isinstance(cx.env.get(o), str):
            raise ImportFailure(f"output {k} of forward is not a tensor ({o!r}); the program model returns tensors")
        vid = cx.env[o]
        v = program.values[vid]
        # a program output must be computed, and each output position gets its own value
        if v.producer is None or vid in program.outputs:
            vid = program.add_node("identity", [vid], name=f"output{k}").outputs[0]
        program.mark_output(vid)
        if len(outs) > 1 or program.values[vid].name.startswith("identity"):
            try:
                program.rename(vid, f"out{k}" if len(outs) > 1 else "out")
            except StitchError:
                pass
