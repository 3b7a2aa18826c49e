"""Which torch operators an `opaque` node may call: pure tensor functions, decided from their schemas.

A project file is data, so the operator it names must not be able to reach anything but the tensors
the node is given. An overload (`torch._ops.OpOverload`) is allowed only when every rule holds:

  namespace   it is in `aten` (prim, profiler, quantized, c10d and custom namespaces are refused);
  mutation    no argument is written (`Tensor(a!)`: in-place `x_` ops, `out=` overloads, `set_`,
              `resize_`, `copy_`, `fill_`), its name does not end in `_`, and it has no `dst`
              argument (`_copy_from` writes it though its schema has no `!`);
  types       no argument or return is a Storage, Generator, Stream, Event or script object, and no
              Device argument is required (an optional one must be null, see below);
  files       no `*from_file*` name and no string argument naming a path (`filename`, `path`, `file`,
              `fname`, `filepath`);
  random      not tagged `nondeterministic_seeded` (rand*, normal, bernoulli, multinomial, uniform,
              dropout...), except an op with a switch that turns the randomness off, allowed only with it
              off (`train`/`training` false, `dropout_p` 0: dropout in eval, attention without dropout);
  memory      no `storage_offset` argument and no view made from explicit strides (`as_strided`,
              `_reshape_alias` reads past its storage), nothing named `unsafe` (`_unsafe_index` skips
              bounds checks), no nested/jagged buffer views, no uninitialised memory (`empty*`,
              `resize`), no pinning (`pin_memory`, `_pin_memory`), no `_assert*` / `_print` /
              `_functionalize*` / `_sync` / autograd and vmap internals;
  results     it returns at least one value and every return is a Tensor or a list of Tensors (so
              `item`, `_local_scalar_dense`, `record_stream`, `sym_size` are refused).

Rules on argument *values* (`check_call`), applied at load with the JSON template and again right
before the call with the real values: a Device argument must be null, `pin_memory` and `unsafe` null
or false, and a seeded op's randomness switch off. An OpOverloadPacket (no overload
named) is resolved, by torch's own schema matching on the template's argument types, to the one
overload a call would run, and that overload is checked; the call then goes to it, never to the packet.

After the call (`check_results`) every result must be a dense strided tensor on the inputs' device:
a sparse, quantized, nested or mkldnn result is refused, so none reaches another operator. Views of inputs
(`view_as_real`, `lift_fresh`, `alias`) only read, so they are allowed, and such a result is copied
so that no program value shares memory with another.
"""
from __future__ import annotations

import functools
import re

import torch

from ..errors import ProgramError
from .common import torch_dtype

_NAMESPACES = ("aten",)
# schema type kinds that are not tensor data (torch._C.Type.kind())
_FORBIDDEN_KINDS = {"StorageType": "a Storage", "GeneratorType": "a Generator", "StreamObjType": "a Stream",
                    "ClassType": "a script object", "AnyClassType": "a script object",
                    "InterfaceType": "a script object", "CapsuleType": "a capsule", "AnyType": "an untyped value",
                    "PyObjectType": "a Python object", "FutureType": "a future", "RRefType": "a remote reference"}
_TENSOR_RESULT_KINDS = {"TensorType", "ListType", "OptionalType"}
_PATH_ARGS = {"filename", "path", "file", "fname", "filepath"}
_DESTINATION_ARGS = {"dst"}  # _copy_from writes dst, though its schema has no (a!)
# the argument that switches a seeded op's randomness off, and its off value: dropout(train=False),
# scaled_dot_product_attention(dropout_p=0.0)
_RANDOMNESS_SWITCHES = {"train": ("BoolType", False), "training": ("BoolType", False),
                        "dropout_p": ("FloatType", 0.0)}
# names whose effect the schema does not show: uninitialised memory, pinned host memory, internals
_NAME_RULES = (
    (re.compile(r"from_file"), "reads or writes a file"),
    (re.compile(r"(^|_)empty($|_)|resize"), "returns uninitialised memory"),
    (re.compile(r"pin_memory|is_pinned"), "moves tensors to pinned host memory"),
    (re.compile(r"^_assert|^_print$|^_functionalize|^_sync$|^_make_dep_token$|record_stream"),
     "is a runtime internal, not a tensor function"),
    (re.compile(r"as_strided|_reshape_alias"), "addresses raw storage through explicit strides"),
    (re.compile(r"unsafe"), "skips the checks that keep its memory accesses in bounds"),
    (re.compile(r"nested|jagged"), "addresses nested-tensor buffers through raw offsets"),
    (re.compile(r"^_add_batch_dim$|^_remove_batch_dim$|^_make_dual|^_unpack_dual$|^_fw_primal|^_lazy_clone$"),
     "is an autograd or vmap internal, not a tensor function"),
)


class OperatorRefused(ProgramError):
    """An opaque node names an operator the policy does not allow."""


def _kinds(t) -> set[str]:
    """Every type kind inside t (List[Optional[Tensor]] -> ListType, OptionalType, TensorType)."""
    out = {t.kind()}
    for c in t.containedTypes():
        out |= _kinds(c)
    return out


def _forbidden(t) -> str | None:
    return next((what for kind, what in _FORBIDDEN_KINDS.items() if kind in _kinds(t)), None)


def _plain(t):
    """t without an outer Optional."""
    return t.getElementType() if t.kind() == "OptionalType" else t


def overload_name(op: torch._ops.OpOverload) -> str:
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname}"


@functools.lru_cache(maxsize=None)
def refusal(op: torch._ops.OpOverload) -> str | None:
    """Why the schema of `op` makes it unsafe to call from a program file, or None when it is allowed."""
    schema = op._schema
    base = schema.name.split("::")[-1]
    if op.namespace not in _NAMESPACES:
        return f"is in the '{op.namespace}' namespace; only aten tensor operators may run"
    for pattern, why in _NAME_RULES:
        if pattern.search(base):
            return why
    for arg in schema.arguments:
        if arg.alias_info is not None and arg.alias_info.is_write:
            return f"writes its argument '{arg.name}' (in-place or out= overload)"
        if arg.name in _DESTINATION_ARGS:
            return f"writes into its argument '{arg.name}'"
        if _forbidden(arg.type):
            return f"takes {_forbidden(arg.type)} argument '{arg.name}'"
        if arg.type.kind() != "OptionalType" and "DeviceObjType" in _kinds(arg.type):
            return f"needs a device argument '{arg.name}' (the program runs where the reference runs)"
        if arg.name in _PATH_ARGS and _plain(arg.type).kind() == "StringType":
            return f"takes a file path argument '{arg.name}'"
        if arg.name == "storage_offset":
            return "addresses raw storage through a storage offset"
    if base.endswith("_"):
        return "is an in-place operator"
    if torch.Tag.nondeterministic_seeded in op.tags and not _train_flag(schema):
        return "draws random numbers"
    if not schema.returns:
        return "returns no tensor"
    for r in schema.returns:
        kinds = _kinds(r.type)
        if "TensorType" not in kinds or not kinds <= _TENSOR_RESULT_KINDS:
            return f"returns {_forbidden(r.type) or 'a ' + str(r.type)}, not a tensor"
        if r.alias_info is not None and r.alias_info.is_write:
            return "returns a tensor it wrote"
    return None


def _train_flag(schema) -> str | None:
    """The argument that turns a seeded op's randomness off (see _RANDOMNESS_SWITCHES), if it has one."""
    for arg in schema.arguments:
        kind = _RANDOMNESS_SWITCHES.get(arg.name, (None,))[0]
        if kind is not None and _plain(arg.type).kind() == kind:
            return arg.name
    return None


def _bound(schema, args: list, kwargs: dict) -> dict:
    """Argument name -> value for the arguments the call gives (positionally or by name)."""
    out = {}
    positional = [a for a in schema.arguments if not a.kwarg_only]
    for a, v in zip(positional, args):
        out[a.name] = v
    names = {a.name for a in schema.arguments}
    out.update({k: v for k, v in kwargs.items() if k in names})
    return out


def check_call(op: torch._ops.OpOverload, args: list, kwargs: dict) -> None:
    """Refuse argument values that would leave the pure-tensor contract (OperatorRefused)."""
    why = refusal(op)
    if why is not None:
        raise OperatorRefused(f"operator {overload_name(op)} is not allowed: it {why}")
    schema = op._schema
    given = _bound(schema, args, kwargs)
    devices = {a.name for a in schema.arguments if "DeviceObjType" in _kinds(a.type)}
    for name, value in given.items():
        if name in devices and value is not None:
            raise OperatorRefused(f"operator {overload_name(op)}: argument '{name}' must be null "
                                  f"(the program runs where the reference runs), got {value!r}")
        if name == "unsafe" and value not in (None, False):
            raise OperatorRefused(f"operator {overload_name(op)}: argument 'unsafe' must be false "
                                  f"(it would skip bounds checks)")
        if name == "pin_memory" and value not in (None, False):
            raise OperatorRefused(f"operator {overload_name(op)}: argument 'pin_memory' must be null or false")
    flag = _train_flag(schema)
    if torch.Tag.nondeterministic_seeded in op.tags:
        default = next(a for a in schema.arguments if a.name == flag)
        value = given.get(flag, default.default_value if default.has_default_value() else True)
        off = _RANDOMNESS_SWITCHES[flag][1]
        if isinstance(value, bool) != isinstance(off, bool) or value != off:
            raise OperatorRefused(f"operator {overload_name(op)} is not allowed with {flag}={value!r}: "
                                  f"it draws random numbers")


def _placeholders(value):
    """The template with every tensor input replaced by an empty meta tensor: enough for schema matching,
    which looks at types only, and nothing is allocated or computed."""
    if isinstance(value, dict):
        if "input" in value:
            return torch.empty(0, device="meta")
        try:
            return torch_dtype(value.get("dtype"))
        except (KeyError, TypeError, ValueError, ProgramError):
            return value  # a malformed template: inference names it
    if isinstance(value, list):
        return [_placeholders(v) for v in value]
    return value


def resolve_overload(obj, args, kwargs, *, filled: bool = False) -> torch._ops.OpOverload:
    """The one checked overload a call of `obj` (an OpOverload or OpOverloadPacket) with these arguments
    runs. args/kwargs are the node's JSON templates, or the real values when filled=True.
    Raises OperatorRefused naming the operator and the rule."""
    if isinstance(obj, torch._ops.OpOverloadPacket):
        a = args if filled else _placeholders(args)
        k = kwargs if filled else {key: _placeholders(v) for key, v in kwargs.items()}
        try:
            name = torch._C._jit_resolve_packet(obj._qualified_op_name, *a, **k)
        except (RuntimeError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OperatorRefused(f"operator {obj._qualified_op_name.replace('::', '.')}: no overload "
                                  f"matches the arguments ({first}); name the overload") from None
        obj = getattr(obj, name or "default")
    if not isinstance(obj, torch._ops.OpOverload):
        raise OperatorRefused(f"{obj!r} is not a torch operator overload")
    if filled:
        check_call(obj, args, kwargs)
    else:
        check_call(obj, _placeholders(args), {key: _placeholders(v) for key, v in kwargs.items()})
    return obj


def check_results(op: torch._ops.OpOverload, results: tuple, inputs: list) -> tuple:
    """The call's results as dense tensors that share memory with no input. A sparse, quantized,
    nested or mkldnn result (the schema cannot say which an op makes) is refused, so no such tensor
    ever reaches another operator; a view of an input is copied."""
    bases = {_storage(t) for t in inputs if isinstance(t, torch.Tensor)} - {None}
    devices = {t.device for t in inputs if isinstance(t, torch.Tensor)}
    out = []
    for i, t in enumerate(results):
        if not isinstance(t, torch.Tensor):
            raise OperatorRefused(f"operator {overload_name(op)}: output {i} is a {type(t).__name__}, not a tensor")
        if t.layout != torch.strided or t.is_quantized or t.is_nested or t.is_mkldnn:
            raise OperatorRefused(f"operator {overload_name(op)}: output {i} is a {t.layout} tensor; "
                                  f"programs hold dense tensors only")
        if devices and t.device not in devices:
            raise OperatorRefused(f"operator {overload_name(op)}: output {i} is on {t.device}, its inputs on "
                                  f"{', '.join(sorted(map(str, devices)))}; the program runs on one device")
        if _storage(t) in bases:
            t = t.clone()
        out.append(t)
    return tuple(out)


def _storage(t: torch.Tensor):
    """Where t's memory starts, or None (a meta tensor has none, an empty one may share address 0)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return (t.device, ptr) if ptr else None
