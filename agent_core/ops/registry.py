"""The op registry: what an op is (category, ports, attributes, shape rule, torch reference).

Every op has a torch reference implementation, so any program runs on the CPU as the reference that
generated code is verified against. Op modules register themselves with `register(OpDef(...))`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ProgramError, ShapeError

CATEGORIES = (
    "pointwise", "reduction", "normalization", "matmul", "convolution", "pooling", "layout", "recurrent",
    "opaque",
)
# complex values only flow between opaque nodes (torch.fft and friends): no library op computes on them
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool",
          "complex64", "complex128")
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor value; what shape inference works on."""
    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPE_BYTES:
            raise ShapeError(f"unknown dtype '{self.dtype}' (known: {', '.join(DTYPES)})")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


_ATTR_KINDS = ("int", "float", "bool", "str", "ints", "floats", "scalar", "json", "ints_or_str")


@dataclass(frozen=True)
class Attr:
    """An op attribute: its kind decides how values are checked and edited.

    kinds: int, float, bool, str, ints (list of int), floats, scalar (int or float), json (any
    JSON-compatible value, used by opaque ops), ints_or_str (a list of int, or one of `choices` as a
    string: conv padding is [1, 1] or "same").
    """
    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple | None = None
    doc: str = ""
    optional: bool = False  # None is an accepted value (e.g. clamp's min)

    def __post_init__(self):
        assert self.kind in _ATTR_KINDS, self.kind

    def check(self, op: str, value: Any) -> Any:
        """Return the value in canonical form, or raise ProgramError saying what is wrong."""
        where = f"{op}.{self.name}"
        if value is None and self.optional:
            return None
        k = self.kind
        if k == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise ProgramError(f"attribute {where} must be an integer, got {value!r}")
        elif k in ("float", "scalar"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProgramError(f"attribute {where} must be a number, got {value!r}")
            value = float(value) if k == "float" else value
        elif k == "bool":
            if not isinstance(value, bool):
                raise ProgramError(f"attribute {where} must be true or false, got {value!r}")
        elif k == "str":
            if not isinstance(value, str):
                raise ProgramError(f"attribute {where} must be a string, got {value!r}")
        elif k == "ints_or_str" and isinstance(value, str):
            if self.choices is not None and value not in self.choices:
                raise ProgramError(f"attribute {where} must be a list of integers or one of "
                                   f"{list(self.choices)}, got {value!r}")
            return value
        elif k in ("ints", "floats", "ints_or_str"):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = [value]
            if not isinstance(value, (list, tuple)):
                raise ProgramError(f"attribute {where} must be a list of numbers, got {value!r}")
            item = Attr(self.name, "float" if k == "floats" else "int")
            value = [item.check(op, v) for v in value]
            if k == "ints_or_str":
                return value
        if self.choices is not None and value not in self.choices:
            raise ProgramError(f"attribute {where} must be one of {list(self.choices)}, got {value!r}")
        return value


def _default_flops(op: "OpDef", ins: list, outs: list, attrs: dict) -> int:
    """One operation per output element for pointwise ops, one per input element for reductions."""
    if op.category in ("layout", "opaque"):
        return 0
    if op.category in ("reduction", "pooling"):
        return sum(s.numel for s in ins if s is not None)
    if op.category == "normalization":
        return 5 * sum(s.numel for s in outs)
    return sum(s.numel for s in outs)


@dataclass(frozen=True)
class OpDef:
    """One op of the library.

    inputs: port names; a trailing '?' marks an optional port, a trailing '*' a variadic last port.
    infer(in_specs, attrs) -> list of output TensorSpec; raise ShapeError with a precise message.
    reference(in_tensors, attrs) -> tensor or tuple of tensors (torch, any device).
    cuda: for pointwise ops, a C expression template over the input names ({x}, {a}, {b}) and attrs,
          used by code generation.
    extra: free-form data; the op tests read extra["example"] = ([input shapes, (shape, dtype) or
          (shape, dtype, init)], attrs) and extra["bad"] = ([inputs], attrs, "message fragment") or
          None when every input shape is valid (see docs/OPS.md, "Adding an op").
    min_inputs: overrides the minimum arity (opaque takes zero or more inputs).
    check_attrs(attrs): a per-op check of the filled-in attributes as a whole, run by normalize_attrs
          (so by the loader, every edit and validation); raise ProgramError saying what is wrong.
    host_scratch: outputs' worth of host memory the CPU reference holds while the op runs, beyond its
          output (memory_check counts it; torch's CPU convolutions: 2, measured on conv_transpose3d).
    """
    name: str
    category: str
    inputs: tuple[str, ...]
    infer: Callable[[list, dict], list]
    reference: Callable[[list, dict], Any]
    attrs: tuple[Attr, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    flops: Callable | None = None
    aliases: tuple[str, ...] = ()
    doc: str = ""
    cuda: str | None = None
    extra: dict = field(default_factory=dict)
    min_inputs: int | None = None  # overrides the arity minimum (a variadic op that may take none)
    check_attrs: Callable[[dict], None] | None = None
    host_scratch: int = 0

    def __post_init__(self):
        assert self.category in CATEGORIES, (self.name, self.category)

    # ports -------------------------------------------------------------------------------
    @property
    def port_names(self) -> list[str]:
        return [p.rstrip("?*") for p in self.inputs]

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def arity(self) -> tuple[int, int | None]:
        """(minimum, maximum) number of inputs; maximum None for variadic ops."""
        required = sum(1 for p in self.inputs if not p.endswith(("?", "*")))
        if self.variadic:
            return (max(required, 1) if self.min_inputs is None else self.min_inputs), None
        return (required if self.min_inputs is None else self.min_inputs), len(self.inputs)

    def port_name(self, index: int) -> str:
        names = self.port_names
        if index < len(names):
            return names[index]
        return f"{names[-1]}{index - len(names) + 1}" if self.variadic else f"in{index}"

    def check_arity(self, n: int) -> None:
        lo, hi = self.arity()
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise ProgramError(f"{self.name} takes {want} inputs ({', '.join(self.inputs)}), got {n}")

    # attributes --------------------------------------------------------------------------
    def normalize_attrs(self, attrs: dict | None) -> dict:
        """Fill defaults, check kinds, refuse unknown or missing attributes, then run the op's check_attrs."""
        attrs = dict(attrs or {})
        known = {a.name: a for a in self.attrs}
        unknown = sorted(set(attrs) - set(known))
        if unknown:
            raise ProgramError(f"{self.name} has no attribute {', '.join(unknown)}"
                               f" (it has: {', '.join(known) or 'none'})")
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                out[a.name] = a.check(self.name, attrs[a.name])
            elif a.default is REQUIRED:
                raise ProgramError(f"{self.name} needs attribute '{a.name}'")
            else:
                out[a.name] = a.default
        if self.check_attrs is not None:
            self.check_attrs(out)
        return out

    def count_flops(self, ins: list, outs: list, attrs: dict) -> int:
        fn = self.flops or (lambda i, o, a: _default_flops(self, i, o, a))
        return int(fn(ins, outs, attrs))


REGISTRY: dict[str, OpDef] = {}
_ALIASES: dict[str, str] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name} registered twice")
    REGISTRY[op.name] = op
    for alias in op.aliases:
        _ALIASES[alias] = op.name
    return op


def get_op(name: str) -> OpDef:
    """The op called `name` (or one of its aliases); ProgramError names close matches if unknown."""
    op = REGISTRY.get(name) or REGISTRY.get(_ALIASES.get(name, ""))
    if op is None:
        import difflib
        close = difflib.get_close_matches(name, list(REGISTRY) + list(_ALIASES), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ProgramError(f"unknown op '{name}'{hint}")
    return op


def all_ops() -> list[OpDef]:
    return sorted(REGISTRY.values(), key=lambda o: (CATEGORIES.index(o.category), o.name))


def aliases_of(name: str) -> list[str]:
    return [a for a, n in _ALIASES.items() if n == name]
