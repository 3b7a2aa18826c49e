"""fp32 matmuls and convolutions on tensor cores, inside the 1e-4 tolerance: split TF32 ("3xTF32").

Each fp32 operand x is split into hi = x rounded to TF32 (10 mantissa bits) and lo = (x - hi) rounded to
TF32, so x = hi + lo to about 2^-22. A bilinear op f (matmul, linear, bmm, convolutions) is then
f(hi_a, hi_b) + f(hi_a, lo_b) + f(lo_a, hi_b): three TF32 tensor-core calls whose products are exact;
only lo_a * lo_b (2^-22 of a product) is dropped. The tensor cores truncate as they accumulate, though,
so the worst error is about 5x fp32's at a reduction of 8192 and grows with its length (measured:
docs/benchmarks/kernelbench_level2_h200.md). On the H200 the three calls take 0.4x the time of one fp32
SGEMM at 1024x8192x8192 and 0.2-0.6x for many transposed convolutions, while others are slower
(tools/tf32x3_probe.py), so the agent times every form per node (agent/precision.py) and keeps one only
when it and then the whole program verify at 1e-4 against the fp32 reference. TF32 stays off for
everything else, the reference and the torch baselines included.

Every bilinear op can also run the three products as one call over parts concatenated along its
reduction, [lo_a, hi_a, hi_a] against [hi_b, lo_b, hi_b] ("3xtf32-cat": a GEMM's K, a convolution's
input channels, within each group for a grouped one, so every group keeps its own channels): the same
work, but one pass over the output instead of three, one launch, and one longer reduction that fills
the tensor cores better; 1.3-2.9x faster than the three summed for most of level 2's transposed
convolutions. The small products come first: the libraries reduce along K in order, and the tensor
cores' truncating sums lose about one unit of the running sum per step, so the 2K small steps cost
almost nothing while the sum is small. With hi * hi first, all 3K steps ran at the full sum's size:
a linear with K = 8192 erred 0.81 of the 1e-4 tolerance against 0.27 for the three calls (H100,
tests/gpu/test_split_tf32_gpu.py). Still, it is preferred only where it is faster. A 1x1 convolution
(stride 1, no padding, one group) runs this form as one cuBLAS GEMM over the concatenated channels
instead of a cuDNN call (channels-last: a linear over the channels), timed against the other forms
like any.

A convolution has one more choice, "fp32-timed": plain fp32 with cuDNN picking its algorithm by timing
the candidates (cudnn.benchmark) instead of by its heuristics, up to 1.8x faster for some 3-D transposed
convolutions. torch caches one algorithm per convolution shape and settings for the process, so the
call also asks for deterministic algorithms: that setting is part of the cache key, which gives these
calls their own entry instead of the heuristic one the reference and the torch baselines made.

A linear or matmul with few output tiles and a long reduction may also run in fp32 with its K cut into
parts (runtime/split_k.py, "fp32-splitk").

A node's choice lives in program.metadata["library_precision"][node id] ("3xtf32", "3xtf32-cat",
"fp32-timed" or "fp32-splitk"; absent = fp32). Parameters are split once and cached for as long as
the parameter tensor lives.

Every form of a 2-D or 3-D convolution (transposed and grouped ones included) can also run in
channels-last memory (NHWC / NDHWC, the layout Inductor's layout optimisation picks for convolutions):
the input and weight converted (a parameter once, cached like its splits; the split forms write the
input's parts there directly instead of copying it first), cuDNN run in that layout, and
the output left in it, so the torch ops after it (pointwise, norms, pools preserve the layout) and the
next convolution of a chain read it without converting again; a generated kernel reads its inputs
contiguous, so the runtime copies it back there (program_runtime.executable.launchable). The choice is
program.metadata["library_layout"][node id] = "channels_last" (absent = the input's own layout), timed
per node with those conversions counted (agent.precision).
"""
from __future__ import annotations

import weakref

from ..ir import Program, Role
from ..reference import run_node
from . import split_kernel
from .library_settings import cudnn_timed, tf32_tensor_cores
from .low_precision import DESCRIPTIONS as LOWER_DESCRIPTIONS, FORMS as LOWER, run_low_precision
from .split_k import SPLIT_K, run_split_k

TF32X3 = "3xtf32"
TF32X3_CAT = "3xtf32-cat"
TIMED_FP32 = "fp32-timed"
CHANNELS_LAST = "channels_last"
CHANNELS_LAST_OPS = frozenset({"conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d"})
SPLIT_OPS = frozenset({"matmul", "bmm", "linear", "conv1d", "conv2d", "conv3d",
                       "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})
_ROUND, _MASK = 0x1000, -0x2000   # round-to-nearest at TF32's 10th mantissa bit, then clear the 13 below
_QUIET_NAN = 0x7FFFFFFF
DESCRIPTIONS = {"fp32": "fp32, TF32 off", TF32X3: "split TF32: three tensor-core products summed",
                TF32X3_CAT: "split TF32: one tensor-core call over parts concatenated along the reduction",
                TIMED_FP32: "fp32, TF32 off, with the cuDNN algorithm picked by timing",
                SPLIT_K: "fp32, TF32 off, its reduction cut into parts run as one batched GEMM and summed"}


def library_precision(program: Program) -> dict[str, str]:
    return program.metadata.get("library_precision") or {}


def library_layout(program: Program) -> dict[str, str]:
    return program.metadata.get("library_layout") or {}


def describe_library_call(program: Program, node_id: str) -> str:
    form = library_precision(program).get(node_id, "fp32")
    text = DESCRIPTIONS[form] if form in DESCRIPTIONS else LOWER_DESCRIPTIONS[form] + ", allowed by the program"
    return text + (", channels-last" if library_layout(program).get(node_id) == CHANNELS_LAST else "")


def can_split(program: Program, node_id: str) -> bool:
    node = program.nodes[node_id]
    return node.op in SPLIT_OPS and all(program.values[v].dtype == "float32" for v in node.inputs if v)


def split_into(t, hi, lo) -> None:
    """hi, lo = split_tf32(t), written into the given tensors (any strides, t's shape) in place: no
    temporaries beside them, so splitting a large weight costs its two parts and nothing more. On the
    GPU one kernel (runtime/split_kernel.py) makes parts laid out as a dense t is, or channels-last
    parts of a contiguous t; other layouts take torch ops of the same bits (_split_ops, which add
    bool masks of t's size)."""
    if _on_gpu(t, hi, lo) and _kernel_ready():
        if _dense(t) and hi.stride() == lo.stride() == t.stride():
            split_kernel.launch(t, hi.data_ptr(), lo.data_ptr(), 0, t.numel(), t.numel())
            return
        if t.is_contiguous() and is_channels_last(hi) and is_channels_last(lo) and \
                split_kernel.launch_to_channels_last(t, hi.data_ptr(), lo.data_ptr(), 0, t.shape[1]):
            return
    _split_ops(t, hi, lo)


def _split_ops(t, hi, lo) -> None:
    """The parts with torch ops (split_kernel's tf32() and tf32_rest(), bit for bit)."""
    import torch
    t_i, hi_i, lo_i = t.view(torch.int32), hi.view(torch.int32), lo.view(torch.int32)
    torch.add(t_i, _ROUND, out=hi_i)
    hi_i.bitwise_and_(_MASK)
    # the fix-ups below take bool masks (a quarter of a part each), never a full-size temporary, and no
    # indexing by a mask: that counts the mask on the host, a synchronisation that spoils a CUDA graph
    # capture (45_UNetSoftmax's transposed convolution, its weight split per call inside the capture).
    # A finite value rounded past the largest float is truncated instead: the add carried into the
    # exponent, so t truncated is one TF32 step (0x2000) below what it made (an infinity stays itself)
    over = torch.isinf(hi).logical_and_(torch.isfinite(t))
    hi_i.add_(over, alpha=-0x2000)
    # a NaN is the quiet NaN with every mantissa bit set: the add would carry a GPU NaN's all-ones
    # mantissa into the sign (-0), and a NaN with only low mantissa bits reads as infinity in TF32
    hi_i.masked_fill_(torch.isnan(t), _QUIET_NAN)
    torch.sub(t, hi, out=lo)
    lo_i.add_(_ROUND)
    lo_i.bitwise_and_(_MASK)
    lo.masked_fill_(torch.isfinite(t).logical_not_(), 0.0)      # hi alone carries an infinity or a NaN


def _on_gpu(*tensors) -> bool:
    import torch
    return all(t.is_cuda and t.dtype == torch.float32 for t in tensors)


def _kernel_ready() -> bool:
    return split_kernel.ready(_split_ops)


def _dense(t) -> bool:
    """Whether t's elements fill its memory span in a standard order (contiguous, channels-last, or a
    contiguous matrix transposed: k.transpose(-2, -1)), so the kernel can split that span flat."""
    return t.is_contiguous() or is_channels_last(t) or (t.dim() >= 2 and t.mT.is_contiguous())


def split_tf32(t, channels_last: bool = False):
    """(hi, lo), both exact in TF32, hi + lo = t to about 2^-22 relative; an infinite or NaN element
    is hi alone (lo 0), so the product is infinite or NaN where fp32's is. channels_last: the parts in
    channels-last memory (t a batched 2-D or 3-D image) whatever t's own layout, with no copy of t."""
    import torch
    fmt = _channels_last_format(t) if channels_last else torch.preserve_format
    hi, lo = torch.empty_like(t, memory_format=fmt), torch.empty_like(t, memory_format=fmt)
    split_into(t, hi, lo)
    return hi, lo


# where lo goes among the three concatenated parts (the other two are hi): A's [lo, hi, hi] against B's
# [hi, lo, hi] pairs lo*hi, hi*lo, then hi*hi (the module's docstring says why in that order)
A_LO, B_LO = 0, 1


def split_cat_into(t, dst, dim: int, lo_at: int, groups: int = 1) -> None:
    """dst = cat of t's split parts along dim: lo at part lo_at (0, 1 or 2), hi at the other two, within
    each of `groups` equal blocks of that dim (a grouped convolution's channels). On the GPU one kernel
    writes all three: in rows when t and dst share a memory order (contiguous ones: rows of a group's
    elements from dim inward; channels-last ones, dim 1: rows of a group's channels), and transposing
    when a contiguous t's parts go to channels-last memory."""
    c = t.shape[dim] // groups    # one group's share of dim
    if _on_gpu(t, dst) and _kernel_ready():
        rows = _cat_rows(t, dst, dim, groups)
        if rows is not None:
            split_kernel.launch(t, *_part_addresses(dst, rows, lo_at), rows, 3 * rows)
            return
        if dim == 1 and t.is_contiguous() and is_channels_last(dst) and \
                split_kernel.launch_to_channels_last(t, *_part_addresses(dst, c, lo_at), 3 * t.shape[1], c):
            return
    blocks, wide = t.unflatten(dim, (groups, c)), dst.unflatten(dim, (groups, 3 * c))
    parts = [wide.narrow(dim + 1, i * c, c) for i in range(3)]
    hi, hi2 = _hi_at(lo_at)
    split_into(blocks, parts[hi], parts[lo_at])
    parts[hi2].copy_(parts[hi])


def _hi_at(lo_at: int) -> tuple[int, int]:
    """The places of the two hi parts when lo is at lo_at."""
    if lo_at not in (0, 1, 2):
        raise ValueError(f"lo_at must be 0, 1 or 2, not {lo_at!r}")
    first, second = (i for i in range(3) if i != lo_at)
    return first, second


def _part_addresses(dst, size: int, lo_at: int) -> tuple[int, int, int]:
    """The addresses of hi, lo and the second hi: the parts start `size` floats apart in dst."""
    at = lambda i: dst.data_ptr() + 4 * i * size
    hi, hi2 = _hi_at(lo_at)
    return at(hi), at(lo_at), at(hi2)


def _cat_rows(t, dst, dim: int, groups: int = 1) -> int | None:
    """Elements per row of t when dst (t's shape, dim three times as long) holds each row's three
    parts side by side (a row: one group's part of dim and everything inward); None when their
    memory orders differ."""
    import math
    if t.is_contiguous() and dst.is_contiguous():
        return math.prod(t.shape[dim:]) // groups
    if dim == 1 and is_channels_last(t) and is_channels_last(dst):
        return t.shape[1] // groups
    return None


def weight_cat(w, w_dim: int, memory_format=None, groups: int = 1):
    """B's parts [hi, lo, hi] of a convolution weight, concatenated along w_dim (its reduction dim) within
    each of `groups` blocks (a transposed convolution's weight holds its groups along dim 0), made in place."""
    import torch
    return cat_parts(w, w_dim, B_LO, memory_format or torch.contiguous_format, groups)


def cat_parts(t, dim: int, lo_at: int, memory_format=None, groups: int = 1):
    """A new tensor of t's parts concatenated along dim (split_cat_into: lo at part lo_at, A_LO or
    B_LO), in memory_format. None (a GEMM's operand): contiguous, except that a transposed matrix
    (k.transpose(-2, -1), a weight's .t()) is concatenated in its own memory order and handed back
    transposed, which cuBLAS reads as it is, so the split kernel writes it in one launch."""
    import torch
    d = t.dim()
    if memory_format is None and d >= 2 and not t.is_contiguous() and t.mT.is_contiguous():
        swapped = {d - 1: d - 2, d - 2: d - 1}.get(dim % d, dim % d)
        return cat_parts(t.mT, swapped, lo_at).mT
    shape = list(t.shape)
    shape[dim] *= 3
    dst = torch.empty(shape, dtype=t.dtype, device=t.device, memory_format=memory_format or torch.contiguous_format)
    split_cat_into(t, dst, dim, lo_at, groups)
    return dst


_param_splits: dict[tuple, tuple] = {}


def _cached(t, form: str, make):
    """make(t) for a parameter, computed once per tensor and form (again if it is changed in place)."""
    key = (id(t), form)
    entry = _param_splits.get(key)
    if entry is not None and entry[0]() is t and entry[1] == t._version:
        return entry[2]
    parts = make(t)
    # the dict is bound, not looked up: a tensor freed at interpreter exit finds the module's globals gone
    _param_splits[key] = (weakref.ref(t, lambda _, k=key, d=_param_splits: d.pop(k, None)), t._version, parts)
    return parts


def cached_bytes(tensors) -> int:
    """Device bytes the caches above hold for these parameter tensors (their split parts, and the
    channel-concatenated weights): memory a run keeps beside the weights themselves."""
    ids = {id(t) for t in tensors}
    total = 0
    for (tid, _form), (ref, _version, parts) in list(_param_splits.items()):
        if tid in ids and ref() is not None:
            for part in parts if isinstance(parts, tuple) else (parts,):
                total += part.untyped_storage().nbytes()
    return total


def drop_cached_splits(tensors) -> int:
    """Forget the caches above for these parameter tensors (a node that no longer runs through the
    library: the tile GEMM splits in registers); the device bytes they held."""
    ids = {id(t) for t in tensors}
    freed = cached_bytes(tensors)
    for key in [k for k in _param_splits if k[0] in ids]:
        _param_splits.pop(key, None)
    return freed


def _is_parameter(program: Program, vid: str) -> bool:
    return program.values[vid].role in (Role.PARAMETER, Role.CONSTANT)


def _cached_split(t):
    return _cached(t, "split", split_tf32)


def can_concatenate(program: Program, node_id: str) -> bool:
    """Whether the concatenated form applies: any op split TF32 covers (a grouped convolution
    concatenates within each group; a matmul of vectors has no K to concatenate along)."""
    node = program.nodes[node_id]
    if not can_split(program, node_id):
        return False
    return node.op not in ("matmul", "bmm") or all(len(program.values[v].shape) >= 2 for v in node.inputs[:2])


def _operands(node, env: dict):
    """(a, b, bias) of a bilinear node; bias None when it has none."""
    bias = env[node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else None
    return env[node.inputs[0]], env[node.inputs[1]], bias


def run_split_tf32(program: Program, node_id: str, env: dict, cache_weights: bool = True,
                   channels_last: bool = False) -> None:
    """run_node for a bilinear node, as three TF32 tensor-core calls (see the module docstring);
    a parameter's parts are cached unless cache_weights is False (then split per call, like an activation).
    channels_last (a convolution): the weight converted to channels-last memory (a parameter once, its
    parts cached from that) and the input's parts made there, so the input is never copied."""
    node = program.nodes[node_id]
    a, b, bias = _operands(node, env)
    if channels_last:
        b = _cached(b, CHANNELS_LAST, to_channels_last) if cache_weights and _is_parameter(program, node.inputs[1]) \
            else to_channels_last(b)

    def parts(vid, t):
        return _cached_split(t) if cache_weights and _is_parameter(program, vid) else split_tf32(t, channels_last)
    a_hi, a_lo = parts(node.inputs[0], a)
    b_hi, b_lo = parts(node.inputs[1], b)
    with tf32_tensor_cores():
        out = _gemm_sum(node.op, a_hi, a_lo, b_hi, b_lo, bias)
        if out is None:
            ref, attrs = node.opdef.reference, node.attrs
            out = ref([a_lo, b_hi, None], attrs)      # the small terms first
            out += ref([a_hi, b_lo, None], attrs)
            out += ref([a_hi, b_hi, bias], attrs)
    env[node.outputs[0]] = out


def _gemm_sum(op, a_hi, a_lo, b_hi, b_lo, bias):
    """The three products of a 2-D GEMM (linear over any batch shape, mm, bmm) summed by cuBLAS itself
    (beta = 1), which saves two passes over the output; None for other shapes."""
    import torch
    if op == "linear" and b_hi.dim() == 2:
        k = a_hi.shape[-1]
        x_hi, x_lo, w_hi, w_lo = a_hi.reshape(-1, k), a_lo.reshape(-1, k), b_hi.t(), b_lo.t()
        out = torch.addmm(bias, x_hi, w_hi) if bias is not None else torch.mm(x_hi, w_hi)
        out.addmm_(x_lo, w_hi)
        out.addmm_(x_hi, w_lo)
        return out.view(*a_hi.shape[:-1], out.shape[-1])
    if op in ("matmul", "bmm") and a_hi.dim() == b_hi.dim() and a_hi.dim() in (2, 3) \
            and a_hi.shape[:-2] == b_hi.shape[:-2]:   # matmul broadcasts batches; bmm does not
        mm, acc = (torch.mm, "addmm_") if a_hi.dim() == 2 else (torch.bmm, "baddbmm_")
        out = mm(a_lo, b_hi)
        getattr(out, acc)(a_hi, b_lo)
        getattr(out, acc)(a_hi, b_hi)
        return out
    return None


def run_timed_fp32(program: Program, node_id: str, env: dict) -> None:
    with cudnn_timed():
        run_node(program, node_id, env)


def run_split_tf32_cat(program: Program, node_id: str, env: dict, cache_weights: bool = True,
                       channels_last: bool = False) -> None:
    """A bilinear node as one TF32 call over its operands' parts concatenated along the reduction
    (_gemm_cat for matmuls and linears; channels_last is for convolutions only), else _conv_cat."""
    if program.nodes[node_id].opdef.category != "convolution":
        _gemm_cat(program, node_id, env, cache_weights)
    else:
        _conv_cat(program, node_id, env, cache_weights, channels_last)


def _gemm_cat(program: Program, node_id: str, env: dict, cache_weights: bool) -> None:
    """A linear, matmul or bmm as one TF32 GEMM over K three times as long: A's parts [lo, hi, hi]
    along its last dim, B's [hi, lo, hi] along its K dim (a linear's weight: its last; a matmul's: its
    second last), so the K blocks pair lo*hi, hi*lo and hi*hi. Batches broadcast as the op does."""
    node = program.nodes[node_id]
    a, b, bias = _operands(node, env)
    k_dim = b.dim() - 1 if node.op == "linear" else b.dim() - 2
    a_cat = cat_parts(a, a.dim() - 1, A_LO)

    def make(w):
        return cat_parts(w, k_dim, B_LO)
    b_cat = _cached(b, "cat", make) if cache_weights and _is_parameter(program, node.inputs[1]) else make(b)
    with tf32_tensor_cores():
        env[node.outputs[0]] = node.opdef.reference([a_cat, b_cat, bias], node.attrs)


def _conv_cat(program: Program, node_id: str, env: dict, cache_weights: bool, channels_last: bool) -> None:
    """A convolution as one TF32 convolution over [lo_a, hi_a, hi_a] and [hi_b, lo_b, hi_b], concatenated
    along the input channels (the weight's dim 1, or dim 0 when transposed), within each group when
    grouped (a group's three parts side by side, so the groups stay what the convolution pairs). The
    parts are written in place into one buffer of three times the input (the only temporary), in
    channels-last memory when asked, so the input is never copied to that layout first."""
    import torch
    node = program.nodes[node_id]
    a, b, bias = _operands(node, env)
    spatial = int(node.op[-2])
    channel = a.dim() - spatial - 1                    # 1, or 0 for an unbatched input
    w_dim = 0 if node.op.startswith("conv_transpose") else 1
    groups = node.attrs.get("groups", 1)
    fmt = _channels_last_format(a) if channels_last else torch.contiguous_format

    def make(w):   # a convolution's weight holds one group's input channels along dim 1: no blocks there
        return weight_cat(w, w_dim, fmt, groups if w_dim == 0 else 1)
    w_cat = (_cached(b, "cat-cl" if channels_last else "cat", make)
             if cache_weights and _is_parameter(program, node.inputs[1]) else make(b))
    a_cat = cat_parts(a, channel, A_LO, fmt, groups)
    with tf32_tensor_cores():
        out = _pointwise_conv(node, a_cat, w_cat, bias) if is_pointwise_conv(node, a_cat, w_cat) else None
        env[node.outputs[0]] = node.opdef.reference([a_cat, w_cat, bias], node.attrs) if out is None else out


GEMM_MIN_POSITIONS = 128   # a contiguous image's positions: one cuBLAS tile's width, or most of it idles


def is_pointwise_conv(node, a, w) -> bool:
    """A 1x1 convolution of a batch (every kernel dim 1, stride 1, no padding, one group) that runs
    well as GEMMs over the channels: channels-last (one GEMM over every position), or contiguous with
    at least GEMM_MIN_POSITIONS positions an image (one GEMM per image; cuDNN folds the batch into its
    GEMM, which smaller images need)."""
    import math
    d = a.dim() - 2
    if not node.op.startswith("conv") or node.op.startswith("conv_transpose") or d != int(node.op[-2]):
        return False
    if not is_channels_last(a) and math.prod(a.shape[2:]) < GEMM_MIN_POSITIONS:
        return False
    stride, pad = node.attrs.get("stride", 1), node.attrs.get("padding", 0)
    ones = lambda v, x: v == x or (isinstance(v, (list, tuple)) and all(e == x for e in v))
    return (node.attrs.get("groups", 1) == 1 and all(k == 1 for k in w.shape[2:]) and ones(stride, 1)
            and (pad in ("valid", "same") or ones(pad, 0)))


def _pointwise_conv(node, a_cat, w_cat, bias):
    """The channel-concatenated 1x1 convolution as one cuBLAS GEMM instead of a cuDNN call: in
    channels-last memory a [N * positions, 3 Cin] x [3 Cin, Cout] GEMM with the bias as its beta term
    (a linear over the channels), the output left channels-last; contiguous, per image
    [Cout, 3 Cin] x [3 Cin, positions], the weight shared by the batch (stride 0, not copied)."""
    import torch
    n, c3, *space = a_cat.shape
    cout = w_cat.shape[0]
    w = w_cat.reshape(cout, c3)
    if is_channels_last(a_cat):
        d = len(space)
        rows = a_cat.permute(0, *range(2, d + 2), 1).reshape(-1, c3)    # a view: NHWC memory
        out = torch.addmm(bias, rows, w.t()) if bias is not None else torch.mm(rows, w.t())
        return out.view(n, *space, cout).permute(0, d + 1, *range(1, d + 1))
    out = torch.matmul(w, a_cat.reshape(n, c3, -1))
    if bias is not None:
        out += bias.view(cout, 1)
    return out.view(n, cout, *space)


def can_channels_last(program: Program, node_id: str) -> bool:
    """A batched fp32 2-D or 3-D convolution: one whose operands have a channels-last memory format."""
    node = program.nodes[node_id]
    if node.op not in CHANNELS_LAST_OPS or not can_split(program, node_id) or len(node.inputs) < 2:
        return False
    rank = int(node.op[-2]) + 2
    return all(v is not None and len(program.values[v].shape) == rank for v in node.inputs[:2])


def _channels_last_format(t):
    import torch
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def to_channels_last(t):
    """t in channels-last memory (itself when it already is)."""
    return t.contiguous(memory_format=_channels_last_format(t))


def is_channels_last(t) -> bool:
    import torch
    return t.dim() in (4, 5) and t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4
                                                 else torch.channels_last_3d)


def channels_last_env(program: Program, node_id: str, env: dict, cache_weights: bool = True) -> dict:
    """env with the node's input and weight in channels-last memory (a parameter's converted once,
    unless cache_weights is False: then every call)."""
    node = program.nodes[node_id]
    a, w = node.inputs[0], node.inputs[1]
    out = dict(env)
    out[a] = to_channels_last(env[a])
    out[w] = _cached(env[w], CHANNELS_LAST, to_channels_last) if cache_weights and _is_parameter(program, w) \
        else to_channels_last(env[w])
    return out


def run_in_layout(program: Program, node_id: str, env: dict, run, layout: str | None,
                  cache_weights: bool = True) -> None:
    """run(program, node_id, env) with the operands in `layout` (None: as they come)."""
    if layout != CHANNELS_LAST:
        run(program, node_id, env)
        return
    local = channels_last_env(program, node_id, env, cache_weights)
    run(program, node_id, local)
    for v in program.nodes[node_id].outputs:
        env[v] = local[v]


def run_library_node(program: Program, node_id: str, env: dict, form: str | None = None,
                     cache_weights: bool = True) -> None:
    """run_node, or the form the agent chose for this node (split TF32, a timed cuDNN algorithm, or a
    lower precision the program allows: runtime/low_precision.py), in the layout it chose. form overrides the agent's ("fp32": plain, in the input's own layout, as
    eager runs it: the channels-last layout was chosen with the split form, and plain fp32 in it was
    never measured); cache_weights=False splits or converts a parameter every call instead of keeping
    its parts (program_runtime.memory_plan decides)."""
    layout = None if form == "fp32" else library_layout(program).get(node_id)
    mode = form or library_precision(program).get(node_id)
    if mode in (TF32X3, TF32X3_CAT):   # each builds its operands' parts in the layout itself
        split_run = run_split_tf32_cat if mode == TF32X3_CAT else run_split_tf32
        split_run(program, node_id, env, cache_weights, layout == CHANNELS_LAST)   # (.., channels_last)
        return

    def run(p, nid, e):
        if mode == TIMED_FP32:
            run_timed_fp32(p, nid, e)
        elif mode == SPLIT_K:
            run_split_k(p, nid, e)
        elif mode in LOWER:
            run_low_precision(p, nid, e, mode)
        else:
            run_node(p, nid, e)
    run_in_layout(program, node_id, env, run, layout, cache_weights)

