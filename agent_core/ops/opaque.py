"""The `opaque` op: a call to a torch operator the library does not know, so that importing a real
model never just fails. The planner treats it as a black box; the reference runs the torch op.

Only pure tensor operators may be named (operator_policy.py states the rule): a file naming any
other is refused when it is loaded or edited (check_attrs, through normalize_attrs), and the check
runs again, on the real argument values, right before every call.

Attributes (all JSON, nothing is ever evaluated or imported):
  target    "aten.upsample_nearest2d.vec": a torch operator, found only by walking the namespaces of
            torch.ops with getattr (namespace, operator, optional overload). Anything that is not an
            operator there (a Python function, a module attribute, torch.ops.load_library) is refused.
  args      the positional arguments as a JSON template: {"input": k} stands for the op's k-th tensor
            input, {"dtype": "float32"} for a torch dtype; lists nest; other values pass through.
  kwargs    keyword arguments, the same template language.
  out_specs [{"shape": [...], "dtype": "float32"}, ...]: one per output, since nothing can be inferred.
  blocked   null, or why the importer refused the operator: the node is then a placeholder that keeps
            the graph visible but never runs, whatever its target (its inference and reference raise
            the reason, so validation reports it). Clearing it is an ordinary edit, checked as any.
"""
from __future__ import annotations

import re

import torch

from ..errors import ProgramError, ShapeError
from .common import dtype_name, torch_dtype
from .operator_policy import OperatorRefused, check_results, resolve_overload
from .registry import DTYPE_BYTES, Attr, OpDef, TensorSpec, register

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def resolve_target(target: str):
    """The torch operator named by target ("namespace.op" or "namespace.op.overload").

    Raises ShapeError naming what is wrong. Only torch.ops namespaces are walked, and the result must
    be an operator (OpOverload or OpOverloadPacket), so no other Python object can be reached.
    """
    parts = target.split(".") if isinstance(target, str) else []
    if parts and parts[0] == "torch" and parts[1:2] == ["ops"]:
        parts = parts[2:]  # accept "torch.ops.aten.x" as well as "aten.x"
    if not 2 <= len(parts) <= 3 or not all(_SEGMENT.match(p) and not p.startswith("__") for p in parts):
        raise ShapeError(f"opaque: target {target!r} must name a torch operator as namespace.op[.overload], "
                         f"e.g. 'aten.upsample_nearest2d.vec'")
    ns = getattr(torch.ops, parts[0], None)
    if not isinstance(ns, torch._ops._OpNamespace):
        raise ShapeError(f"opaque: {parts[0]!r} is not a torch.ops namespace (target {target!r})")
    try:
        obj = getattr(ns, parts[1])
        if len(parts) == 3:
            if not isinstance(obj, torch._ops.OpOverloadPacket):
                raise AttributeError
            obj = getattr(obj, parts[2])
    except (AttributeError, RuntimeError):
        raise ShapeError(f"opaque: torch has no operator {target!r}") from None
    if not isinstance(obj, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        raise ShapeError(f"opaque: {target!r} is not a torch operator")
    return obj


def _check_template(value, n_inputs: int, where: str) -> None:
    if isinstance(value, dict):
        if set(value) == {"input"}:
            k = value["input"]
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_inputs:
                raise ShapeError(f"opaque: {where} refers to input {k!r} but the node has {n_inputs} "
                                 f"tensor input{'s' if n_inputs != 1 else ''}")
        elif set(value) == {"dtype"}:
            if value["dtype"] not in DTYPE_BYTES:
                raise ShapeError(f"opaque: {where} names unknown dtype {value['dtype']!r}")
        else:
            raise ShapeError(f"opaque: {where} holds an object {value!r}; only {{\"input\": k}} and "
                             f"{{\"dtype\": name}} are allowed")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_template(v, n_inputs, f"{where}[{i}]")
    elif not (value is None or isinstance(value, (bool, int, float, str))):
        raise ShapeError(f"opaque: {where} holds {type(value).__name__}, which is not JSON")


def _fill(value, tensors):
    if isinstance(value, dict):
        return tensors[value["input"]] if "input" in value else torch_dtype(value["dtype"])
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    return value


def out_specs(attrs) -> list[TensorSpec]:
    specs = attrs["out_specs"]
    if not isinstance(specs, list) or not specs:
        raise ShapeError("opaque: out_specs must be a non-empty list of {\"shape\": [...], \"dtype\": ...}")
    out = []
    for i, s in enumerate(specs):
        shape = s.get("shape") if isinstance(s, dict) else None
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise ShapeError(f"opaque: out_specs[{i}] needs a shape list of non-negative integers, got {s!r}")
        out.append(TensorSpec(tuple(shape), s.get("dtype", "float32")))
    return out


def _check_attrs(attrs) -> None:
    """At load and on every edit: a target that names a torch operator must be one the policy allows
    (a name that resolves to nothing is left to inference, which reports it as the node's error)."""
    if attrs["blocked"] is not None:
        return
    try:
        obj = resolve_target(attrs["target"])
    except ShapeError:
        return
    args = attrs["args"] if isinstance(attrs["args"], list) else []
    kwargs = attrs["kwargs"] if isinstance(attrs["kwargs"], dict) else {}
    try:
        resolve_overload(obj, args, kwargs)
    except OperatorRefused as e:
        raise OperatorRefused(f"opaque: {e}; an opaque node may call only a pure tensor operator "
                              f"(docs/OPS.md), use library ops instead") from None


def _blocked(attrs) -> ProgramError:
    return ProgramError(f"opaque {attrs['target']}: blocked, this placeholder never runs: {attrs['blocked']}; "
                        f"replace it with library ops")


def _infer(ins, attrs):
    if attrs["blocked"] is not None:
        raise _blocked(attrs)
    obj = resolve_target(attrs["target"])
    if not isinstance(attrs["args"], list):
        raise ShapeError(f"opaque: args must be a list, got {attrs['args']!r}")
    if not isinstance(attrs["kwargs"], dict):
        raise ShapeError(f"opaque: kwargs must be an object, got {attrs['kwargs']!r}")
    _check_template(attrs["args"], len(ins), "args")
    for key, v in attrs["kwargs"].items():
        _check_template(v, len(ins), f"kwargs.{key}")
    resolve_overload(obj, attrs["args"], attrs["kwargs"])
    return out_specs(attrs)


def _reference(tensors, attrs):
    if attrs["blocked"] is not None:
        raise _blocked(attrs)
    _check_template(attrs["args"], len(tensors), "args")
    for key, v in attrs["kwargs"].items():
        _check_template(v, len(tensors), f"kwargs.{key}")
    args = _fill(attrs["args"], tensors)
    kwargs = {k: _fill(v, tensors) for k, v in attrs["kwargs"].items()}
    # checked again here, on the values the call gets: a program built in memory skips the loader
    fn = resolve_overload(resolve_target(attrs["target"]), args, kwargs, filled=True)
    result = fn(*args, **kwargs)
    results = check_results(fn, tuple(result) if isinstance(result, (tuple, list)) else (result,), tensors)
    want = out_specs(attrs)
    if len(results) < len(want):
        raise ProgramError(f"opaque {attrs['target']}: returned {len(results)} outputs, out_specs lists {len(want)}")
    for i, (t, spec) in enumerate(zip(results, want)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
            got = f"{dtype_name(t.dtype)}{list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ProgramError(f"opaque {attrs['target']}: output {i} is {got} but out_specs says {spec}")
    return results[:len(want)] if len(want) > 1 else results[0]


register(OpDef(
    "opaque", "opaque", ("inputs*",), _infer, _reference, min_inputs=0,
    attrs=(Attr("target", "str", doc="torch operator, e.g. 'aten.upsample_nearest2d.vec'"),
           Attr("args", "json", [], doc="positional arguments; {\"input\": k} is tensor input k"),
           Attr("kwargs", "json", {}, doc="keyword arguments, same template language"),
           Attr("out_specs", "json", doc="[{\"shape\": [...], \"dtype\": \"float32\"}, ...]"),
           Attr("blocked", "str", None, optional=True,
                doc="why the importer refused the operator: a placeholder that never runs")),
    outputs=("0",), check_attrs=_check_attrs,
    doc="a pure torch tensor operator the library does not know; runs through torch, shapes as declared",
    extra={"example": ([(1, 2, 3, 4)], {"target": "aten.upsample_nearest2d.vec",
                                        "args": [{"input": 0}, [6, 8], None],
                                        "out_specs": [{"shape": [1, 2, 6, 8], "dtype": "float32"}]}),
           "bad": ([(2, 3)], {"target": "aten.add.Tensor", "args": [{"input": 0}, {"input": 1}],
                              "out_specs": [{"shape": [2, 3]}]}, "refers to input 1")},
))
