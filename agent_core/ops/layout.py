"""Layout ops: they move, copy, pick or mask elements but compute nothing (reshape, permute, cat,
slice, split, pad, ...), plus the gathers (embedding, gather, index_select).

Multi-output ops (split, chunk, unbind) infer one spec per piece; their outputs are named 0, 1, ...
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from .common import fmt_shape, norm_dim, promote
from .registry import Attr, OpDef, TensorSpec, register

_INTS = ("int64", "int32", "int8", "uint8")


def _dim(op, d, rank):
    return norm_dim(d, rank, f"{op}: dim")


def _axis(op, d, x):
    """A dimension of x that has a size (ops that index along it refuse scalars)."""
    if x.rank == 0:
        raise ShapeError(f"{op}: the input is a scalar, it has no dimension {d}")
    return norm_dim(d, x.rank, f"{op}: dim")


def _layout(name, infer, ref, attrs=(), aliases=(), doc="", example=None, bad=None, inputs=("x",),
            outputs=("out",), flops=None):
    register(OpDef(name, "layout", inputs, infer, ref, attrs=attrs, aliases=aliases, doc=doc,
                   outputs=outputs, flops=flops,
                   extra={"example": example, "bad": bad}))


# --- reshapes ------------------------------------------------------------------------------------
def reshape_shape(shape: tuple, target, op: str = "reshape") -> tuple:
    """Resolve a target shape with at most one -1 against the element count of `shape`."""
    numel = math.prod(shape)
    target = list(target)
    if sum(1 for t in target if t == -1) > 1:
        raise ShapeError(f"{op}: shape {fmt_shape(target)} has more than one -1")
    if any(t < -1 for t in target):
        raise ShapeError(f"{op}: shape {fmt_shape(target)} has a negative size")
    known = math.prod(t for t in target if t != -1)
    if -1 in target:
        if known == 0 or numel % known:
            raise ShapeError(f"{op}: cannot reshape {fmt_shape(shape)} ({numel} elements) into "
                             f"{fmt_shape(target)}")
        target[target.index(-1)] = numel // known
    elif known != numel:
        raise ShapeError(f"{op}: cannot reshape {fmt_shape(shape)} ({numel} elements) into "
                         f"{fmt_shape(target)} ({known} elements)")
    return tuple(target)


_layout("reshape", lambda ins, a: [TensorSpec(reshape_shape(ins[0].shape, a["shape"]), ins[0].dtype)],
        lambda t, a: torch.reshape(t[0], a["shape"]),
        attrs=(Attr("shape", "ints", doc="the new shape; one entry may be -1 (inferred)"),),
        aliases=("view", "_unsafe_view"), doc="same elements in a new shape (view when contiguous)",
        example=([(2, 3, 4)], {"shape": [4, -1]}), bad=([(2, 3)], {"shape": [4, -1]}, "cannot reshape [2, 3]"))


def _flatten_infer(ins, a):
    x = ins[0]
    s, e = _dim("flatten", a["start_dim"], x.rank), _dim("flatten", a["end_dim"], x.rank)
    if x.rank == 0:
        return [TensorSpec((1,), x.dtype)]
    if s > e:
        raise ShapeError(f"flatten: start_dim {a['start_dim']} comes after end_dim {a['end_dim']} for "
                         f"input {fmt_shape(x.shape)}")
    return [TensorSpec(x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:], x.dtype)]


_layout("flatten", _flatten_infer, lambda t, a: torch.flatten(t[0], a["start_dim"], a["end_dim"]),
        attrs=(Attr("start_dim", "int", 0), Attr("end_dim", "int", -1)),
        doc="merge dimensions start_dim..end_dim into one",
        example=([(2, 3, 4, 5)], {"start_dim": 1, "end_dim": 2}),
        bad=([(2, 3)], {"start_dim": 1, "end_dim": 0}, "comes after"))


def _unflatten_infer(ins, a):
    x = ins[0]
    d = _dim("unflatten", a["dim"], x.rank)
    try:
        sizes = reshape_shape((x.shape[d],), a["sizes"], "unflatten")
    except ShapeError:
        raise ShapeError(f"unflatten: sizes {a['sizes']} do not split dimension {a['dim']} of size {x.shape[d]} "
                         f"(input {fmt_shape(x.shape)})") from None
    return [TensorSpec(x.shape[:d] + sizes + x.shape[d + 1:], x.dtype)]


_layout("unflatten", _unflatten_infer, lambda t, a: torch.unflatten(t[0], a["dim"], a["sizes"]),
        attrs=(Attr("dim", "int"), Attr("sizes", "ints")), doc="split one dimension into several",
        example=([(2, 12)], {"dim": 1, "sizes": [3, -1]}), bad=([(2, 12)], {"dim": 1, "sizes": [5, -1]}, "do not split"))


def _squeeze_infer(ins, a):
    x = ins[0]
    dims = range(x.rank) if a["dim"] is None else {_dim("squeeze", d, x.rank) for d in a["dim"]}
    drop = {d for d in dims if x.shape[d] == 1}
    return [TensorSpec(tuple(s for i, s in enumerate(x.shape) if i not in drop), x.dtype)]


_layout("squeeze", _squeeze_infer,
        lambda t, a: torch.squeeze(t[0]) if a["dim"] is None else torch.squeeze(t[0], tuple(a["dim"])),
        attrs=(Attr("dim", "ints", None, optional=True, doc="null: every size-1 dimension"),),
        doc="drop size-1 dimensions (others named in dim are kept, as in torch)",
        example=([(2, 1, 3, 1)], {"dim": [1, 2]}), bad=([(2, 1)], {"dim": [2]}, "out of range"))


def _unsqueeze_infer(ins, a):
    x = ins[0]
    d = norm_dim(a["dim"], x.rank + 1, "unsqueeze: dim")
    return [TensorSpec(x.shape[:d] + (1,) + x.shape[d:], x.dtype)]


_layout("unsqueeze", _unsqueeze_infer, lambda t, a: torch.unsqueeze(t[0], a["dim"]),
        attrs=(Attr("dim", "int"),), doc="insert a size-1 dimension at dim",
        example=([(2, 3)], {"dim": -1}), bad=([(2, 3)], {"dim": 3}, "out of range"))


def _permute_infer(ins, a):
    x = ins[0]
    dims = a["dims"]
    norm = [norm_dim(d, x.rank, "permute: dim") for d in dims] if len(dims) == x.rank else None
    if norm is None or sorted(norm) != list(range(x.rank)):
        raise ShapeError(f"permute: dims {dims} must be a permutation of the {x.rank} dimensions of "
                         f"input {fmt_shape(x.shape)}")
    return [TensorSpec(tuple(x.shape[d] for d in norm), x.dtype)]


_layout("permute", _permute_infer, lambda t, a: torch.permute(t[0], a["dims"]),
        attrs=(Attr("dims", "ints"),), doc="reorder dimensions: output dim i is input dim dims[i]",
        example=([(2, 3, 4)], {"dims": [2, 0, 1]}), bad=([(2, 3, 4)], {"dims": [0, 1]}, "permutation"))


def _transpose_infer(ins, a):
    x = ins[0]
    d0, d1 = _dim("transpose", a["dim0"], x.rank), _dim("transpose", a["dim1"], x.rank)
    shape = list(x.shape)
    if shape:
        shape[d0], shape[d1] = shape[d1], shape[d0]
    return [TensorSpec(tuple(shape), x.dtype)]


_layout("transpose", _transpose_infer, lambda t, a: torch.transpose(t[0], a["dim0"], a["dim1"]),
        attrs=(Attr("dim0", "int"), Attr("dim1", "int")), aliases=("swapaxes",),
        doc="swap two dimensions", example=([(2, 3, 4)], {"dim0": 0, "dim1": -1}),
        bad=([(2, 3)], {"dim0": 0, "dim1": 2}, "out of range"))


def _expand_infer(ins, a):
    x, size = ins[0], list(a["size"])
    if len(size) < x.rank:
        raise ShapeError(f"expand: size {fmt_shape(size)} has fewer dimensions than input {fmt_shape(x.shape)}")
    lead = len(size) - x.rank
    out = []
    for i, s in enumerate(size):
        have = x.shape[i - lead] if i >= lead else None
        if s == -1:
            if have is None:
                raise ShapeError(f"expand: -1 is not allowed for the new leading dimension {i} in size "
                                 f"{fmt_shape(size)}")
            s = have
        elif s < 0 or (have is not None and have != 1 and have != s):
            raise ShapeError(f"expand: input {fmt_shape(x.shape)} cannot be expanded to {fmt_shape(size)} "
                             f"(only size-1 dimensions expand)")
        out.append(s)
    return [TensorSpec(tuple(out), x.dtype)]


_layout("expand", _expand_infer, lambda t, a: t[0].expand(*a["size"]),
        attrs=(Attr("size", "ints", doc="-1 keeps a dimension"),), aliases=("broadcast_to",),
        doc="broadcast size-1 dimensions (and new leading ones) without copying",
        example=([(3, 1)], {"size": [2, -1, 4]}), bad=([(3, 2)], {"size": [3, 4]}, "cannot be expanded"))


def _repeat_infer(ins, a):
    x, reps = ins[0], a["repeats"]
    if len(reps) < x.rank or min(reps, default=0) < 0:
        raise ShapeError(f"repeat: repeats {reps} must be non-negative, one per dimension of input "
                         f"{fmt_shape(x.shape)} (or more)")
    shape = (1,) * (len(reps) - x.rank) + x.shape
    return [TensorSpec(tuple(s * r for s, r in zip(shape, reps)), x.dtype)]


_layout("repeat", _repeat_infer, lambda t, a: t[0].repeat(*a["repeats"]), attrs=(Attr("repeats", "ints"),),
        doc="tile the tensor repeats[i] times along each dimension",
        example=([(2, 3)], {"repeats": [2, 1, 2]}), bad=([(2, 3)], {"repeats": [2]}, "one per dimension"),
        flops=None)


# --- joining and splitting ------------------------------------------------------------------------
def _cat_infer(ins, a):
    first = ins[0]
    if first.rank == 0:
        raise ShapeError("cat: zero-dimensional tensors cannot be concatenated")
    d = _dim("cat", a["dim"], first.rank)
    total = 0
    for k, s in enumerate(ins):
        if s.rank != first.rank or any(s.shape[i] != first.shape[i] for i in range(s.rank) if i != d):
            raise ShapeError(f"cat: tensor {k} {fmt_shape(s.shape)} does not match tensor 0 "
                             f"{fmt_shape(first.shape)} outside dim {a['dim']}")
        total += s.shape[d]
    shape = list(first.shape)
    shape[d] = total
    return [TensorSpec(tuple(shape), promote(*(s.dtype for s in ins)))]


_layout("cat", _cat_infer, lambda t, a: torch.cat(list(t), dim=a["dim"]), attrs=(Attr("dim", "int", 0),),
        aliases=("concat", "concatenate"), inputs=("tensors*",),
        doc="join tensors along an existing dimension",
        example=([(2, 3), (2, 1), (2, 4)], {"dim": 1}), bad=([(2, 3), (3, 3)], {"dim": 1}, "does not match"))


def _stack_infer(ins, a):
    first = ins[0]
    d = norm_dim(a["dim"], first.rank + 1, "stack: dim")
    for k, s in enumerate(ins):
        if s.shape != first.shape:
            raise ShapeError(f"stack: tensor {k} {fmt_shape(s.shape)} differs from tensor 0 "
                             f"{fmt_shape(first.shape)}; stack needs equal shapes")
    return [TensorSpec(first.shape[:d] + (len(ins),) + first.shape[d:], promote(*(s.dtype for s in ins)))]


_layout("stack", _stack_infer, lambda t, a: torch.stack(list(t), dim=a["dim"]), attrs=(Attr("dim", "int", 0),),
        inputs=("tensors*",), doc="join equal-shape tensors along a new dimension",
        example=([(2, 3), (2, 3)], {"dim": 1}), bad=([(2, 3), (2, 4)], {}, "equal shapes"))


def slice_len(size: int, start, end, step: int) -> int:
    return len(range(*slice(start, end, step).indices(size)))


def _slice_infer(ins, a):
    x = ins[0]
    if x.rank == 0:
        raise ShapeError("slice: a scalar cannot be sliced")
    d = _dim("slice", a["dim"], x.rank)
    if a["step"] < 1:
        raise ShapeError(f"slice: step must be positive, got {a['step']}")
    shape = list(x.shape)
    shape[d] = slice_len(x.shape[d], a["start"], a["end"], a["step"])
    return [TensorSpec(tuple(shape), x.dtype)]


def _slice_ref(t, a):
    d = a["dim"] % t[0].ndim
    return t[0][(slice(None),) * d + (slice(a["start"], a["end"], a["step"]),)]


_layout("slice", _slice_infer, _slice_ref,
        attrs=(Attr("dim", "int", 0), Attr("start", "int", None, optional=True),
               Attr("end", "int", None, optional=True), Attr("step", "int", 1)),
        doc="x[start:end:step] along dim (python rules: negative indices count from the end, out-of-range "
            "bounds clamp)",
        example=([(4, 10)], {"dim": 1, "start": 1, "end": -2, "step": 3}),
        bad=([(4, 10)], {"dim": 1, "step": 0}, "step must be positive"))


def _select_infer(ins, a):
    x = ins[0]
    d = _axis("select", a["dim"], x)
    if not -x.shape[d] <= a["index"] < x.shape[d]:
        raise ShapeError(f"select: index {a['index']} is out of range for dim {a['dim']} of size "
                         f"{x.shape[d]} (input {fmt_shape(x.shape)})")
    return [TensorSpec(x.shape[:d] + x.shape[d + 1:], x.dtype)]


_layout("select", _select_infer, lambda t, a: torch.select(t[0], a["dim"], a["index"]),
        attrs=(Attr("dim", "int"), Attr("index", "int")), doc="x[..., index, ...] at dim (drops that dim)",
        example=([(3, 4, 5)], {"dim": 1, "index": -1}), bad=([(3, 4)], {"dim": 1, "index": 4}, "out of range"))


def _split_sizes(size: int, spec: list[int], op: str) -> list[int]:
    if len(spec) == 1:  # a chunk size (a single section equal to the size means the same thing)
        n = spec[0]
        if n < 1:
            raise ShapeError(f"{op}: split size must be positive, got {n}")
        return [min(n, size - i) for i in range(0, size, n)] or [0]
    if sum(spec) != size or min(spec) < 0:
        raise ShapeError(f"{op}: sections {spec} sum to {sum(spec)} but the dimension has size {size}")
    return spec


def _split_infer(ins, a):
    x = ins[0]
    d = _axis("split", a["dim"], x)
    sizes = _split_sizes(x.shape[d], a["split_size_or_sections"], "split")
    return [TensorSpec(x.shape[:d] + (n,) + x.shape[d + 1:], x.dtype) for n in sizes]


def _split_ref(t, a):
    spec = a["split_size_or_sections"]
    return tuple(torch.split(t[0], spec[0] if len(spec) == 1 else spec, dim=a["dim"]))


_layout("split", _split_infer, _split_ref,
        attrs=(Attr("split_size_or_sections", "ints", doc="one entry: the size of each piece; several: "
                                                          "the size of every piece"),
               Attr("dim", "int", 0)),
        aliases=("split_with_sizes",), outputs=("0",), doc="cut into pieces along dim (one output each)",
        example=([(7, 2)], {"split_size_or_sections": [3]}),
        bad=([(7, 2)], {"split_size_or_sections": [3, 3]}, "sum to 6"))


def _chunk_infer(ins, a):
    x = ins[0]
    d = _axis("chunk", a["dim"], x)
    if a["chunks"] < 1:
        raise ShapeError(f"chunk: chunks must be positive, got {a['chunks']}")
    size = x.shape[d]
    step = -(-size // a["chunks"]) if size else 0
    sizes = _split_sizes(size, [step], "chunk") if step else [0] * a["chunks"]
    return [TensorSpec(x.shape[:d] + (n,) + x.shape[d + 1:], x.dtype) for n in sizes]


_layout("chunk", _chunk_infer, lambda t, a: tuple(torch.chunk(t[0], a["chunks"], a["dim"])),
        attrs=(Attr("chunks", "int"), Attr("dim", "int", 0)), outputs=("0",),
        doc="cut into `chunks` nearly equal pieces (torch may return fewer)",
        example=([(2, 7)], {"chunks": 3, "dim": 1}), bad=([(2, 7)], {"chunks": 0}, "must be positive"))


def _unbind_infer(ins, a):
    x = ins[0]
    d = _axis("unbind", a["dim"], x)
    return [TensorSpec(x.shape[:d] + x.shape[d + 1:], x.dtype)] * x.shape[d]


_layout("unbind", _unbind_infer, lambda t, a: tuple(torch.unbind(t[0], a["dim"])),
        attrs=(Attr("dim", "int", 0),), outputs=("0",), doc="one output per index of dim (dim removed)",
        example=([(3, 2)], {"dim": 0}), bad=([(3, 2)], {"dim": 2}, "out of range"))


# --- padding, copies, flips, masks ------------------------------------------------------------------
def _pad_infer(ins, a):
    x, pad = ins[0], a["pad"]
    if len(pad) % 2 or len(pad) // 2 > x.rank:
        raise ShapeError(f"pad: pad {pad} must hold (left, right) pairs for at most the {x.rank} "
                         f"dimensions of input {fmt_shape(x.shape)}, last dimension first")
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        d = x.rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if a["mode"] == "reflect" and (lo >= shape[d] or hi >= shape[d]):
            raise ShapeError(f"pad: reflect padding {lo}, {hi} must be smaller than dimension {d} of size "
                             f"{shape[d]}")
        shape[d] += lo + hi
        if shape[d] < 0:
            raise ShapeError(f"pad: pad {pad} removes more than dimension {d} of input {fmt_shape(x.shape)}")
    return [TensorSpec(tuple(shape), x.dtype)]


def _pad_ref(t, a):
    if a["mode"] == "constant":
        return F.pad(t[0], a["pad"], mode="constant", value=a["value"])
    return F.pad(t[0], a["pad"], mode=a["mode"])


_layout("pad", _pad_infer, _pad_ref,
        attrs=(Attr("pad", "ints", doc="(left, right) pairs, last dimension first; negative crops"),
               Attr("mode", "str", "constant", choices=("constant", "reflect", "replicate", "circular")),
               Attr("value", "float", 0.0, doc="fill value of constant padding")),
        aliases=("constant_pad_nd",), doc="pad with a constant (or reflect / replicate / circular)",
        example=([(2, 3, 4)], {"pad": [1, 2, 0, -1], "value": 0.5}),
        bad=([(2, 3)], {"pad": [1, 1, 1]}, "pairs"))

_layout("contiguous", lambda ins, a: [TensorSpec(ins[0].shape, ins[0].dtype)],
        lambda t, a: t[0].contiguous().clone(), aliases=("clone",),
        doc="a dense row-major copy (where a view has to be materialized)", example=([(2, 3)], {}))


def _flip_infer(ins, a):
    x = ins[0]
    if len({_dim("flip", d, x.rank) for d in a["dims"]}) != len(a["dims"]):
        raise ShapeError(f"flip: dims {a['dims']} names a dimension twice")
    return [TensorSpec(x.shape, x.dtype)]


_layout("flip", _flip_infer, lambda t, a: torch.flip(t[0], a["dims"]), attrs=(Attr("dims", "ints"),),
        doc="reverse the order of elements along dims", example=([(2, 3, 4)], {"dims": [0, 2]}),
        bad=([(2, 3)], {"dims": [2]}, "out of range"))


def _roll_infer(ins, a):
    x = ins[0]
    if a["dims"] and len(a["dims"]) != len(a["shifts"]):
        raise ShapeError(f"roll: shifts {a['shifts']} and dims {a['dims']} need the same length")
    for d in a["dims"] or []:
        _dim("roll", d, x.rank)
    return [TensorSpec(x.shape, x.dtype)]


_layout("roll", _roll_infer, lambda t, a: torch.roll(t[0], a["shifts"], a["dims"] or None),
        attrs=(Attr("shifts", "ints"), Attr("dims", "ints", None, optional=True, doc="null: the flattened tensor")),
        doc="rotate elements along dims", example=([(3, 4)], {"shifts": [1, -1], "dims": [0, 1]}),
        bad=([(3, 4)], {"shifts": [1], "dims": [0, 1]}, "same length"))


def _tri_infer(op):
    def infer(ins, a):
        x = ins[0]
        if x.rank < 2:
            raise ShapeError(f"{op}: input must have at least 2 dimensions (a matrix), got {fmt_shape(x.shape)}")
        return [TensorSpec(x.shape, x.dtype)]
    return infer


for _name, _fn, _part in (("triu", torch.triu, "upper"), ("tril", torch.tril, "lower")):
    _layout(_name, _tri_infer(_name), lambda t, a, _f=_fn: _f(t[0], a["diagonal"]),
            attrs=(Attr("diagonal", "int", 0),),
            doc=f"keep the {_part} triangle of the last two dimensions, zero the rest",
            example=([(2, 4, 4)], {"diagonal": 1}), bad=([(4,)], {}, "at least 2 dimensions"))


def _diag_infer(ins, a):
    x, k = ins[0], a["diagonal"]
    if x.rank == 1:
        n = x.shape[0] + abs(k)
        return [TensorSpec((n, n), x.dtype)]
    if x.rank == 2:
        rows, cols = x.shape
        n = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
        return [TensorSpec((n,), x.dtype)]
    raise ShapeError(f"diag: input must be a vector or a matrix, got {fmt_shape(x.shape)}")


_layout("diag", _diag_infer, lambda t, a: torch.diag(t[0], a["diagonal"]), attrs=(Attr("diagonal", "int", 0),),
        doc="a vector becomes a diagonal matrix; a matrix gives its diagonal",
        example=([(4,)], {}), bad=([(2, 3, 4)], {}, "vector or a matrix"))


def _diagonal_infer(ins, a):
    from .common import norm_dim
    x, k = ins[0], a["offset"]
    if x.rank < 2:
        raise ShapeError(f"diagonal: input must have at least 2 dimensions, got {fmt_shape(x.shape)}")
    d1, d2 = norm_dim(a["dim1"], x.rank, "dim1"), norm_dim(a["dim2"], x.rank, "dim2")
    if d1 == d2:
        raise ShapeError(f"diagonal: dim1 and dim2 must differ, both are {d1}")
    s1, s2 = x.shape[d1], x.shape[d2]
    n = max(0, min(s1, s2 - k) if k >= 0 else min(s1 + k, s2))
    return [TensorSpec(tuple(s for d, s in enumerate(x.shape) if d not in (d1, d2)) + (n,), x.dtype)]


_layout("diagonal", _diagonal_infer, lambda t, a: torch.diagonal(t[0], a["offset"], a["dim1"], a["dim2"]),
        attrs=(Attr("offset", "int", 0), Attr("dim1", "int", 0), Attr("dim2", "int", 1)),
        doc="the offset-th diagonal of dims dim1 and dim2, as a new last dimension (torch.diagonal)",
        example=([(2, 4, 5)], {"offset": 1, "dim1": 1, "dim2": 2}), bad=([(4,)], {}, "at least 2 dimensions"))


# --- gathers ------------------------------------------------------------------------------------
def _need_int(op, spec, what):
    if spec.dtype not in _INTS:
        raise ShapeError(f"{op}: {what} must be an integer tensor, got {spec.dtype}")


def _embedding_infer(ins, a):
    idx, w = ins
    _need_int("embedding", idx, "indices")
    if w.rank != 2:
        raise ShapeError(f"embedding: weight must be [num_embeddings, embedding_dim], got {fmt_shape(w.shape)}")
    return [TensorSpec(idx.shape + (w.shape[1],), w.dtype)]


register(OpDef("embedding", "layout", ("indices", "weight"), _embedding_infer,
               lambda t, a: F.embedding(t[0], t[1]),
               doc="rows of weight picked by integer indices (nn.Embedding)",
               extra={"example": ([((2, 3), "int64", {"kind": "randint", "low": 0, "high": 10}), (10, 4)], {}),
                      "bad": ([((2, 3), "float32"), (10, 4)], {}, "integer tensor")}))


def _gather_infer(ins, a):
    x, idx = ins
    _need_int("gather", idx, "index")
    d = _axis("gather", a["dim"], x)
    if idx.rank != x.rank or any(idx.shape[i] > x.shape[i] for i in range(x.rank) if i != d):
        raise ShapeError(f"gather: index {fmt_shape(idx.shape)} must have the rank of input "
                         f"{fmt_shape(x.shape)} and be no larger outside dim {a['dim']}")
    return [TensorSpec(idx.shape, x.dtype)]


register(OpDef("gather", "layout", ("x", "index"), _gather_infer,
               lambda t, a: torch.gather(t[0], a["dim"], t[1]), attrs=(Attr("dim", "int"),),
               doc="out[i][j] = x[index[i][j]][j] (dim 0); index values pick along dim",
               extra={"example": ([(3, 5), ((3, 2), "int64", {"kind": "randint", "low": 0, "high": 5})], {"dim": 1}),
                      "bad": ([(3, 5), ((4, 2), "int64")], {"dim": 1}, "no larger")}))


def _index_select_infer(ins, a):
    x, idx = ins
    _need_int("index_select", idx, "index")
    if idx.rank > 1:
        raise ShapeError(f"index_select: index must be 1-D, got {fmt_shape(idx.shape)}")
    d = _axis("index_select", a["dim"], x)
    return [TensorSpec(x.shape[:d] + (idx.numel,) + x.shape[d + 1:], x.dtype)]


register(OpDef("index_select", "layout", ("x", "index"), _index_select_infer,
               lambda t, a: torch.index_select(t[0], a["dim"], t[1]), attrs=(Attr("dim", "int"),),
               doc="the slices of x at the given indices along dim",
               extra={"example": ([(3, 5), ((4,), "int64", {"kind": "randint", "low": 0, "high": 3})], {"dim": 0}),
                      "bad": ([(3, 5), ((2, 2), "int64")], {"dim": 0}, "must be 1-D")}))
