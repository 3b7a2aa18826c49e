"""Shape-rule helpers shared by the op modules."""
from __future__ import annotations

import torch

from ..errors import ShapeError
from .registry import FLOAT_DTYPES, TensorSpec

_TORCH_DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool, "complex64": torch.complex64, "complex128": torch.complex128,
}
_DTYPE_NAMES = {v: k for k, v in _TORCH_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def dtype_name(dt: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dt]
    except KeyError:
        raise ShapeError(f"unsupported dtype {dt}") from None


def promote(*dtypes: str) -> str:
    """Result dtype of mixing tensors of these dtypes (torch's promotion rules)."""
    out = torch_dtype(dtypes[0])
    for d in dtypes[1:]:
        out = torch.promote_types(out, torch_dtype(d))
    return dtype_name(out)


def float_of(dtype: str) -> str:
    """The dtype a float op produces from this input dtype (ints promote to float32)."""
    return dtype if dtype in FLOAT_DTYPES else "float32"


def broadcasts_to(shape, target) -> bool:
    """Whether `shape` broadcasts to `target` as torch aligns them (trailing dims; leading dims of
    `shape` beyond `target`'s rank must be 1)."""
    shape, target = tuple(shape), tuple(target)
    extra = len(shape) - len(target)
    if extra > 0:
        if any(s != 1 for s in shape[:extra]):
            return False
        shape = shape[extra:]
    return all(a in (1, b) for a, b in zip((1,) * (len(target) - len(shape)) + shape, target))


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy/torch broadcasting of shapes. Pure Python: shape inference runs this for every
    pointwise node, and torch.broadcast_shapes costs about 0.3 ms a call."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            if d == out[i] or d == 1:
                continue
            if out[i] != 1:
                raise ShapeError("shapes " + " and ".join(_fmt(s) for s in shapes) + " do not broadcast")
            out[i] = d
    return tuple(int(d) for d in out)


def norm_dim(dim: int, rank: int, what: str = "dim") -> int:
    """A dimension index in [0, rank), accepting negative indices; ShapeError if out of range."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise ShapeError(f"{what} {dim} is out of range for a tensor of rank {rank}")
    return dim % r


def norm_dims(dims, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    out = sorted({norm_dim(d, rank) for d in dims})
    return out


def reduce_shape(shape: tuple[int, ...], dims, keepdim: bool) -> tuple[int, ...]:
    dims = norm_dims(dims, len(shape))
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)


def need_rank(spec: TensorSpec, ranks, what: str = "input") -> None:
    ranks = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    if spec.rank not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ShapeError(f"{what} must have rank {want}, got shape {_fmt(spec.shape)}")


def _fmt(shape) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


fmt_shape = _fmt


def opt(specs, i: int):
    """The i-th entry of an input list, or None when that optional port is absent or unconnected."""
    return specs[i] if i < len(specs) else None


def ntuple(value, n: int, what: str) -> list[int]:
    """An int-list attribute expanded to n entries (torch accepts one value for every dimension)."""
    if isinstance(value, int):
        return [value] * n
    value = list(value)
    if len(value) == 1:
        return value * n
    if len(value) != n:
        want = "1 value" if n == 1 else f"1 or {n} values"
        raise ShapeError(f"{what} needs {want}, got {len(value)} ({value})")
    return value


def same_shape(a: TensorSpec, b: TensorSpec, what_a: str, what_b: str, op: str) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"{op}: {what_a} {_fmt(a.shape)} and {what_b} {_fmt(b.shape)} must have the same shape")


def need_float(spec: TensorSpec, op: str, what: str = "input") -> None:
    """Torch refuses some ops on integer tensors (mean, std, norms): say so before running."""
    if spec.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: {what} must be a floating-point tensor, got {spec.dtype} "
                         f"(cast it first)")


def int_result(dtype: str) -> str:
    """Torch's sum, prod and cumsum accumulate integers and bools in int64."""
    return dtype if dtype in FLOAT_DTYPES else "int64"
