"""The rewrite rules. Each takes (program, node id) and returns a Rewrite or None.

Rules only propose; the engine checks every replacement numerically before it is kept. Messages name
the nodes and give the numbers, since users read them in the decision log.
"""
from __future__ import annotations

import math
from contextvars import ContextVar

import numpy as np
import torch

from ..analysis.cost import fmt_bytes
from ..ir import Node, Program
from ..ops import FLOAT_DTYPES
from ..ops.common import ntuple
from ..reference import run_node
from .edits import Rewrite, add_param, param_array, single_use
from .edits import node_label as _n, producer as _producer, reduced_dims as _reduced_dims, transposed_matrix
from .einsum import lower_einsum
from .equal_nodes import merge_equal_nodes
from .equal_views import merge_equal_views
from .gated_linears import merge_gated_linears
from .linear_reduce import pool_linear, reduce_conv_spatial
from .lowering import lower_loss
from .loss_formulas import FLT_MIN
from .raise_attention import raise_attention
from .skinny_linear import skinny_linear
from .thin_cat import pointwise_of_thin_cat, reduce_of_thin_cat


def _val(program, vid):
    return program.values[vid]


def _reshape(program, vid, shape, name=None) -> str:
    return program.add_node("reshape", [vid], {"shape": list(shape)}, name=name).outputs[0]


def _float(program, vid) -> bool:
    return program.values[vid].dtype in FLOAT_DTYPES


# --- no-ops -------------------------------------------------------------------------------------
_IDENTITY_SCALAR = {"mul_scalar": 1, "div_scalar": 1, "pow_scalar": 1, "add_scalar": 0, "sub_scalar": 0}


def drop_noop(program: Program, nid: str) -> Rewrite | None:
    """Ops that return their input unchanged: eval dropout, identity, contiguous, a cast to the same
    dtype, a reshape or expand to the same shape, a permute that keeps the order, x*1, x+0."""
    n = program.nodes[nid]
    if len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None:
        return None
    src, out = n.inputs[0], n.outputs[0]
    if _val(program, src).spec != _val(program, out).spec:
        return None
    why = None
    if n.op in ("dropout", "identity", "contiguous"):
        why = f"{_n(program, nid)} passes its input through unchanged" + (" (dropout in eval mode)" if n.op == "dropout" else "")
    elif n.op in ("cast", "reshape", "expand", "flatten", "squeeze", "unsqueeze", "unflatten"):
        why = f"{_n(program, nid)} keeps the shape {list(_val(program, out).shape)} and dtype, so it does nothing"
    elif n.op == "permute" and list(n.attrs["dims"]) == sorted(d % max(len(n.attrs["dims"]), 1) for d in n.attrs["dims"]):
        why = f"{_n(program, nid)} keeps the dimension order"
    elif n.op == "transpose" and n.attrs["dim0"] % max(len(_val(program, src).shape), 1) == n.attrs["dim1"] % max(len(_val(program, src).shape), 1):
        why = f"{_n(program, nid)} swaps a dimension with itself"
    elif n.op in _IDENTITY_SCALAR and n.attrs["value"] == _IDENTITY_SCALAR[n.op]:
        why = f"{_n(program, nid)} with value {n.attrs['value']} is the identity"
    if why is None:
        return None
    if out in program.outputs and src in program.outputs:
        return None
    return Rewrite("drop_noop", why + "; removed.", lambda p: {out: src}, nid)


_SIZE_ONE_OK = ("sum", "mean", "max", "min", "logsumexp", "prod", "norm")


def reduce_size_one(program: Program, nid: str) -> Rewrite | None:
    """A reduction over dimensions that all have size 1 (sum, mean, max, min, logsumexp, prod) returns
    its input; without keepdim it is a reshape (free). Adaptive pooling to the input's own size too."""
    n = program.nodes[nid]
    if len(n.outputs) != 1 or not n.inputs or n.inputs[0] is None:
        return None
    src, out = n.inputs[0], n.outputs[0]
    shape = _val(program, src).shape
    if n.op in _SIZE_ONE_OK and n.opdef.category == "reduction":
        if n.op == "norm" and n.attrs.get("p") not in (1.0, 2.0):
            return None
        dims = _reduced_dims(n, len(shape))
        if not shape or any(shape[d] != 1 for d in dims):
            return None
        if n.op == "norm":  # |x| over one element; keep abs
            return None
        what = f"{_n(program, nid)} reduces over dims {dims} of size 1 in {list(shape)}"
    elif n.opdef.category == "pooling" and n.op.startswith("adaptive") and _val(program, out).shape == shape:
        what = f"{_n(program, nid)} pools {list(shape)} to its own size"
    else:
        return None
    out_shape = _val(program, out).shape
    if _val(program, out).dtype != _val(program, src).dtype:
        return None

    def build(p):
        return {out: src if tuple(out_shape) == tuple(shape) else _reshape(p, src, out_shape)}
    return Rewrite("reduce_size_one", what + ", so it returns its input" +
                   ("" if tuple(out_shape) == tuple(shape) else " reshaped") + "; removed.", build, nid)


# --- scalar arithmetic ------------------------------------------------------------------------------
def _affine(node) -> tuple[float, float] | None:
    """(a, b) with node(x) = a*x + b, for the scalar ops that are affine."""
    op, v = node.op, node.attrs.get("value")
    if op == "mul_scalar":
        return float(v), 0.0
    if op == "div_scalar" and v != 0:
        return 1.0 / float(v), 0.0
    if op == "add_scalar":
        return 1.0, float(v)
    if op == "sub_scalar":
        return 1.0, -float(v)
    if op == "rsub_scalar":
        return -1.0, float(v)
    if op == "neg":
        return -1.0, 0.0
    return None


def fold_scalar_chain(program: Program, nid: str) -> Rewrite | None:
    """A chain of scalar multiplies, divides, adds, subtracts and negations is one multiply-add:
    x*2/4+1-3 becomes x*0.5 + -2. Matched at the chain's first op."""
    n = program.nodes[nid]
    if _affine(n) is None or not _float(program, n.outputs[0]):
        return None
    # start of a chain: the producer is not itself a foldable link
    prod = _producer(program, n.inputs[0])
    if prod is not None and _affine(prod) is not None and single_use(program, prod.outputs[0]):
        return None
    chain = [n]
    while single_use(program, chain[-1].outputs[0]):
        (cid,) = {c for c, _ in program.consumers(chain[-1].outputs[0])}
        c = program.nodes[cid]
        if _affine(c) is None:
            break
        chain.append(c)
    if len(chain) < 2:
        return None
    a, b = 1.0, 0.0
    for c in chain:
        ca, cb = _affine(c)
        a, b = ca * a, ca * b + cb
    kept = (a != 1.0) + (b != 0.0 or a == 1.0)
    if kept >= len(chain):
        return None
    src, out = n.inputs[0], chain[-1].outputs[0]
    names = ", ".join(_n(program, c.id) for c in chain)

    def build(p):
        v = src
        if a != 1.0:
            v = p.add_node("mul_scalar", [v], {"value": a}).outputs[0]
        if b != 0.0 or v == src:
            v = p.add_node("add_scalar", [v], {"value": b}).outputs[0]
        return {out: v}
    return Rewrite("fold_scalar_chain", f"{len(chain)} scalar ops ({names}) are one affine map "
                   f"x*{a:.6g} + {b:.6g}; {len(chain)} ops become {kept}.", build, nid)


def fold_self_add(program: Program, nid: str) -> Rewrite | None:
    """x*c + x is x*(c+1), x*c - x is x*(c-1), x - x*c is x*(1-c), and x + x is x*2."""
    n = program.nodes[nid]
    if n.op not in ("add", "sub") or len(n.inputs) != 2 or None in n.inputs:
        return None
    a, b = n.inputs
    out = n.outputs[0]
    if not _float(program, out) or _val(program, out).shape != _val(program, a).shape:
        return None
    if a == b:
        if n.op == "sub":
            return None
        return Rewrite("fold_self_add", f"{_n(program, nid)} adds a value to itself: x*2.",
                       lambda p: {out: p.add_node("mul_scalar", [a], {"value": 2.0}).outputs[0]}, nid)
    for scaled, plain, sign in ((a, b, 1), (b, a, 2)):
        m = _producer(program, scaled)
        if m is None or m.op != "mul_scalar" or m.inputs[0] != plain or not single_use(program, scaled):
            continue
        c = float(m.attrs["value"])
        if n.op == "add":
            k = c + 1.0
        else:
            k = c - 1.0 if sign == 1 else 1.0 - c
        return Rewrite("fold_self_add", f"{_n(program, nid)} of x and {_n(program, m.id)} (x*{c:.6g}) is "
                       f"x*{k:.6g}; two ops become one (the residual add of a scaled copy).",
                       lambda p, k=k: {out: p.add_node("mul_scalar", [plain], {"value": k}).outputs[0]}, nid)
    return None


def log_of_softmax(program: Program, nid: str) -> Rewrite | None:
    """log(max(softmax(x), c)) is max(log_softmax(x), log c) for a normal float c (log is
    increasing; where softmax underflows below c both give log c): per element a subtraction of
    per-row terms instead of a logf of a quotient. KL divergence against softmax targets is written
    so (rewrites/lowering.py), and so is a hand-written loss with a clamp. An unclamped log(softmax(x))
    is left alone: it is -inf where softmax underflows, and log_softmax is not."""
    n = program.nodes[nid]
    if n.op != "log" or not n.inputs or n.inputs[0] is None:
        return None
    floor = _producer(program, n.inputs[0])
    if floor is None or floor.op != "max_scalar" or not float(floor.attrs["value"]) >= FLT_MIN:
        return None
    src = _producer(program, floor.inputs[0])
    if src is None or src.op != "softmax" or not _float(program, src.outputs[0]):
        return None
    clamp = float(floor.attrs["value"])
    x, dim, out = src.inputs[0], src.attrs["dim"], n.outputs[0]
    if not _float(program, x) or _val(program, out).dtype != _val(program, x).dtype:
        return None

    def build(p):
        v = p.add_node("log_softmax", [x], {"dim": dim}).outputs[0]
        return {out: p.add_node("max_scalar", [v], {"value": math.log(clamp)}).outputs[0]}
    return Rewrite("log_of_softmax", f"{_n(program, nid)} of {_n(program, src.id)} clamped at {clamp:.6g} is its "
                   f"log_softmax clamped at log {clamp:.6g}: no logf of a quotient per element.", build, nid)


def _same_max_window(node, d: int) -> list[int] | None:
    """The kernel sizes of a max pool that keeps its input's size (stride 1, no dilation, odd kernels
    padded by half), else None."""
    a = node.attrs
    k, p = ntuple(a["kernel_size"], d, "kernel_size"), ntuple(a.get("padding") or [0], d, "padding")
    s = ntuple(a.get("stride") or a["kernel_size"], d, "stride")
    dil = ntuple(a.get("dilation") or [1], d, "dilation")
    same = all(ki % 2 == 1 and pi == ki // 2 for ki, pi in zip(k, p)) and set(s) == {1} \
        and set(dil) == {1} and not a.get("ceil_mode")
    return k if same else None


def merge_max_windows(program: Program, nid: str) -> Rewrite | None:
    """A max pool of a max pool, both stride 1 and padded to keep the size (YOLO's SPPF: three 5 x 5
    pools in a row), is one max pool of the first one's input over the combined window (k1 + k2 - 1):
    the max of maxes is the max over every position either reaches, and the padding only ever adds -inf.
    One window of 9 x 9 reads 81 elements where a pool of a pool generated as one kernel reads 25 x 25."""
    n = program.nodes[nid]
    if not n.op.startswith("max_pool") or len(n.outputs) != 1:
        return None
    d = int(n.op[len("max_pool")])
    inner = _producer(program, n.inputs[0])
    if inner is None or inner.op != n.op or len(inner.outputs) != 1:
        return None
    k2, k1 = _same_max_window(n, d), _same_max_window(inner, d)
    if k1 is None or k2 is None:
        return None
    k = [a + b - 1 for a, b in zip(k1, k2)]
    x, out = inner.inputs[0], n.outputs[0]

    def build(p):
        attrs = {"kernel_size": k, "stride": [1] * d, "padding": [v // 2 for v in k], "dilation": [1] * d,
                 "ceil_mode": False}
        return {out: p.add_node(n.op, [x], attrs).outputs[0]}
    return Rewrite("merge_max_windows", f"{_n(program, nid)} of {_n(program, inner.id)} (windows {k2} and {k1}, "
                   f"stride 1, size kept) is one {n.op} of its input over {k}.", build, nid)


# --- constants ---------------------------------------------------------------------------------------
_FOLD_LIMIT = 64 * 2**20
# where folds compute: the device the engine's checker (and so the end-to-end reference) runs on. exp
# on the CPU and on the GPU differ in the last bit, and a program like Mamba2's chunked scan sums
# terms up to 1e15 that cancel, so a CPU-folded exp missed a GPU reference by 14x the tolerance
# (KernelBench level-3 48, batch 64, on the CPU with one exp rounded differently).
FOLD_DEVICE: ContextVar[str] = ContextVar("fold_device", default="cpu")


def fold_constants(program: Program, nid: str) -> Rewrite | None:
    """A node whose inputs are all parameters or constants (a transposed weight, a scaled bias) is
    computed once here and becomes a parameter."""
    n = program.nodes[nid]
    if not n.inputs or n.opdef.category == "opaque" or len(n.outputs) != 1:
        return None
    ins = [v for v in n.inputs if v is not None]
    if not ins or any(param_array(program, v) is None for v in ins):
        return None
    out = n.outputs[0]
    if _val(program, out).nbytes > _FOLD_LIMIT:
        return None
    def build(p):
        dev = FOLD_DEVICE.get()
        env = {v: torch.from_numpy(np.ascontiguousarray(param_array(p, v))).to(dev) for v in ins}
        run_node(p, nid, env)
        arr = env[out].cpu().numpy()
        vid = p.add_parameter(p.unique_name(p.values[out].name + "_folded"), arr).id
        return {out: vid}
    return Rewrite("fold_constants", f"{_n(program, nid)} reads only parameters, so its "
                   f"{list(_val(program, out).shape)} result is computed once ahead of time.", build, nid)


# --- folding into a preceding linear or convolution ------------------------------------------------
def _channel_layout(program, node):
    """For a linear / conv / conv_transpose / matmul-with-parameter node: (weight value, bias value or
    None, function scaling weight columns per output channel, output channel axis, channels)."""
    op = node.op
    cat = node.opdef.category
    out_shape = _val(program, node.outputs[0]).shape
    if op == "linear":
        w = node.inputs[1]
        wa = param_array(program, w)
        if wa is None:
            return None
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        return w, bias, lambda W, s: W * s.reshape(-1, 1), len(out_shape) - 1, wa.shape[0]
    if cat == "convolution" and op.startswith("conv_transpose"):
        w = node.inputs[1]
        wa = param_array(program, w)
        if wa is None:
            return None
        g = node.attrs.get("groups", 1)
        cin, cpg = wa.shape[0], wa.shape[1]
        k = wa.shape[2:]

        def scale(W, s):
            return (W.reshape(g, cin // g, cpg, *k) * s.reshape(g, 1, cpg, *([1] * len(k)))).reshape(W.shape)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        return w, bias, scale, 1, cpg * g
    if cat == "convolution":
        w = node.inputs[1]
        wa = param_array(program, w)
        if wa is None:
            return None
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        return w, bias, lambda W, s: W * s.reshape(-1, *([1] * (W.ndim - 1))), 1, wa.shape[0]
    if op == "matmul" and param_array(program, node.inputs[1]) is not None:
        wa = param_array(program, node.inputs[1])
        if wa.ndim != 2:
            return None
        return node.inputs[1], "no-bias", lambda W, s: W * s.reshape(1, -1), len(out_shape) - 1, wa.shape[1]
    return None


def _per_channel(program, vid, out_shape, axis) -> np.ndarray | None:
    """The value as a vector over the output channel axis, if it is a parameter that broadcasts along
    that axis only (or a single number)."""
    arr = param_array(program, vid)
    if arr is None:
        return None
    shape = arr.shape
    if len(shape) > len(out_shape):
        return None
    full = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    for i, d in enumerate(full):
        if d != 1 and (i != axis or d != out_shape[axis]):
            return None
    return np.broadcast_to(arr.reshape(full), tuple(out_shape[axis] if i == axis else 1
                                                    for i in range(len(out_shape)))).reshape(-1).astype(np.float64)


def _rebuild(p, node, w_new, b_new):
    """A copy of node reading new weight and bias arrays."""
    w = add_param(p, p.unique_name(p.values[node.inputs[1]].name + "_folded"), w_new, like=node.inputs[1])
    ins = list(node.inputs)
    ins[1] = w
    if b_new is not None:
        b = add_param(p, p.unique_name((p.values[node.inputs[2]].name if len(ins) > 2 and ins[2]
                                        else node.name + "_bias") + "_folded"), b_new, like=node.inputs[1])
        ins = ins[:2] + [b] + ins[3:]
    return p.add_node(node.op, ins, dict(node.attrs)).outputs[0]


def fold_batch_norm(program: Program, nid: str) -> Rewrite | None:
    """Eval-mode batch_norm right after a conv or linear is a per-channel scale and shift: folded into
    the weights and bias (recomputed here), the normalization disappears."""
    n = program.nodes[nid]
    if n.op != "batch_norm" or n.attrs.get("training"):
        return None
    x = n.inputs[0]
    prod = _producer(program, x)
    if prod is None or not single_use(program, x):
        return None
    lay = _channel_layout(program, prod)
    if lay is None or lay[1] == "no-bias" or lay[3] != 1:  # batch_norm normalizes dim 1
        return None
    w, bias, scale, axis, ch = lay
    arrs = [param_array(program, v) if v else None for v in (n.inputs + [None] * 5)[1:5]]
    mean, var, gamma, beta = arrs
    if mean is None or var is None or (n.inputs[3:4] and n.inputs[3] and gamma is None) or \
            (n.inputs[4:5] and n.inputs[4] and beta is None):
        return None
    if mean.size != ch:
        return None
    eps = float(n.attrs["eps"])
    inv = (gamma.astype(np.float64) if gamma is not None else 1.0) / np.sqrt(var.astype(np.float64) + eps)
    inv = np.broadcast_to(inv, (ch,))
    shift = (beta.astype(np.float64) if beta is not None else 0.0) - mean.astype(np.float64) * inv
    Wa = param_array(program, w).astype(np.float64)
    ba = param_array(program, bias).astype(np.float64) if bias else np.zeros(ch)
    out = n.outputs[0]
    size = fmt_bytes(_val(program, out).nbytes)

    def build(p):
        return {out: _rebuild(p, prod, scale(Wa, inv), ba * inv + shift)}
    return Rewrite("fold_batch_norm", f"{_n(program, nid)} (eval, {ch} channels, eps {eps:g}) folded into "
                   f"{_n(program, prod.id)}: weights and bias rescaled per channel, removing a pass over "
                   f"its {size} output.", build, nid)


_AFFINE_BIN = ("mul", "div", "add", "sub")


def fold_affine_into_producer(program: Program, nid: str) -> Rewrite | None:
    """A scalar or per-channel multiply, divide, add or subtract by a constant right after a linear,
    conv or matmul with a weight parameter goes into that weight and bias."""
    n = program.nodes[nid]
    if n.op in ("mul_scalar", "div_scalar", "add_scalar", "sub_scalar"):
        x, const = n.inputs[0], float(n.attrs["value"])
        if n.op == "div_scalar" and const == 0:
            return None
        mul = n.op in ("mul_scalar", "div_scalar")
        factor = (const if n.op == "mul_scalar" else 1.0 / const) if mul else None
        shift = None if mul else (const if n.op == "add_scalar" else -const)
        vec = None
    elif n.op in _AFFINE_BIN and len(n.inputs) == 2 and None not in n.inputs:
        a, b = n.inputs
        if param_array(program, b) is not None and _producer(program, a) is not None:
            x, c = a, b
        elif n.op in ("mul", "add") and param_array(program, a) is not None and _producer(program, b) is not None:
            x, c = b, a
        else:
            return None
        vec = c
        mul = n.op in ("mul", "div")
        factor = shift = None
    else:
        return None
    prod = _producer(program, x)
    if prod is None or not single_use(program, x) or not _float(program, x):
        return None
    lay = _channel_layout(program, prod)
    if lay is None:
        return None
    w, bias, scale, axis, ch = lay
    out = n.outputs[0]
    out_shape = _val(program, x).shape
    if _val(program, out).shape != out_shape or _val(program, out).dtype != _val(program, x).dtype:
        return None
    if vec is not None:
        s = _per_channel(program, vec, out_shape, axis)
        if s is None:
            return None
        if n.op == "div":
            if np.any(s == 0):
                return None
            s = 1.0 / s
        if n.op == "sub":
            s = -s
        if mul:
            factor = s
        else:
            shift = s
    if bias == "no-bias" and not mul:
        return None
    Wa = param_array(program, w).astype(np.float64)
    ba = param_array(program, bias).astype(np.float64) if bias not in (None, "no-bias") else None
    fvec = np.broadcast_to(np.asarray(factor, dtype=np.float64), (ch,)) if mul else None
    svec = np.broadcast_to(np.asarray(shift, dtype=np.float64), (ch,)) if not mul else None

    def build(p):
        if mul:
            return {out: _rebuild(p, prod, scale(Wa, fvec), ba * fvec if ba is not None else None)}
        return {out: _rebuild(p, prod, Wa, (ba if ba is not None else np.zeros(ch)) + svec)}
    what = "scale" if mul else "shift"
    how = "per channel" if vec is not None else "by a constant"
    return Rewrite("fold_affine_into_producer", f"{_n(program, nid)} is a {what} {how} of "
                   f"{_n(program, prod.id)}'s output, folded into its "
                   f"{'weights and bias' if mul else 'bias'}; one op less.", build, nid)


# --- a convolution's bias into the kernel after it -----------------------------------------------------
def _fuses_a_bias(program: Program, vid: str) -> bool:
    """Every reader of `vid` is a pointwise op or a cat, which the planner fuses into a generated
    kernel that can add a per-channel bias while it reads; not a program output."""
    from ..codegen.pointwise import is_elementwise
    users = [program.nodes[c] for c, _ in program.consumers(vid)]
    return bool(users) and vid not in program.outputs and \
        all(is_elementwise(u) or u.op == "cat" for u in users)


def bias_into_epilogue(program: Program, nid: str) -> Rewrite | None:
    """torch runs a convolution's bias as one more kernel after cuDNN's (a read and a write of the
    whole output); when only generated kernels read the output, the bias is an add they do for free."""
    n = program.nodes[nid]
    if n.opdef.category != "convolution" or len(n.inputs) < 3 or n.inputs[2] is None:
        return None
    out, bias = n.outputs[0], n.inputs[2]
    if not _float(program, out) or not _fuses_a_bias(program, out):
        return None
    rank = len(_val(program, out).shape)
    if rank != int(n.op[-2]) + 2:         # an unbatched input: its channels are dim 0, rare enough
        return None
    channels = _val(program, out).shape[1]
    b = param_array(program, bias)
    if b is None or b.shape != (channels,):
        return None

    def build(p):
        conv = p.add_node(n.op, [n.inputs[0], n.inputs[1]], dict(n.attrs)).outputs[0]
        # a parameter in the broadcast shape, not a reshape: the add stays a plain pointwise op
        per_channel = add_param(p, p.unique_name(p.values[bias].name + "_per_channel"),
                                b.reshape([channels] + [1] * (rank - 2)), like=bias)
        return {out: p.add_node("add", [conv, per_channel], {}).outputs[0]}
    return Rewrite("bias_into_epilogue", f"{_n(program, nid)}'s bias is added by the kernel that reads its "
                   f"output instead of by one more torch kernel: saves a pass over "
                   f"{fmt_bytes(2 * _val(program, out).nbytes)}.", build, nid)


# --- reductions after a linear ----------------------------------------------------------------------
def reduce_linear(program: Program, nid: str) -> Rewrite | None:
    """sum (or mean) over the output features of x @ W^T + b is x @ (sum of W's rows) + sum of b: a
    matrix-vector product instead of a full matrix product and a reduction."""
    n = program.nodes[nid]
    if n.op not in ("sum", "mean") or n.inputs[0] is None:
        return None
    x = n.inputs[0]
    prod = _producer(program, x)
    if prod is None or not single_use(program, x) or prod.op not in ("linear", "matmul"):
        return None
    shape = _val(program, x).shape
    if len(shape) < 2 or _reduced_dims(n, len(shape)) != [len(shape) - 1]:
        return None
    t = _producer(program, prod.inputs[1]) if prod.op == "matmul" else None
    if t is not None and t.op in ("transpose", "permute") and param_array(program, t.inputs[0]) is not None \
            and param_array(program, t.inputs[0]).ndim == 2:
        # x @ W.T with W a [out, in] parameter (torch.matmul(x, self.weight.T)): a linear without bias
        w, bias, ch = t.inputs[0], None, param_array(program, t.inputs[0]).shape[0]
        prod = _as_linear(prod, w)
        lay = (w, None, None, None, ch)
    else:
        lay = _channel_layout(program, prod)
    if lay is None:
        return None
    w, bias, _, _, ch = lay
    k = 1.0 / ch if n.op == "mean" else 1.0
    Wa = param_array(program, w).astype(np.float64)
    ba = param_array(program, bias).astype(np.float64) if bias not in (None, "no-bias") else None
    out = n.outputs[0]
    keep = n.attrs.get("keepdim", False)
    in_f = Wa.shape[1] if prod.op == "linear" else Wa.shape[0]
    flops_before = 2 * math.prod(shape[:-1]) * in_f * ch

    def build(p):
        if prod.op == "linear":
            wv = Wa.sum(axis=0, keepdims=True) * k
            bv = np.array([ba.sum() * k]) if ba is not None else None
            w_id = add_param(p, p.unique_name(p.values[w].name + "_rowsum"), wv, like=w)
            ins = [prod.inputs[0], w_id] + ([add_param(p, p.unique_name(prod.name + "_bias_sum"), bv, like=w)]
                                            if bv is not None else [])
            v = p.add_node("linear", ins).outputs[0]
        else:
            wv = Wa.sum(axis=1, keepdims=True) * k
            w_id = add_param(p, p.unique_name(p.values[w].name + "_colsum"), wv, like=w)
            v = p.add_node("matmul", [prod.inputs[0], w_id]).outputs[0]
        if not keep:
            v = _reshape(p, v, _val(p, out).shape)
        return {out: v}
    return Rewrite("reduce_linear", f"{_n(program, nid)} over the {ch} output features of "
                   f"{_n(program, prod.id)} is a matrix-vector product with the summed weights: "
                   f"{flops_before / 1e6:.3g} MFLOP become {flops_before / ch / 1e6:.3g} MFLOP and the "
                   f"{fmt_bytes(_val(program, x).nbytes)} product is never stored.", build, nid)


def scale_after_reduction(program: Program, nid: str) -> Rewrite | None:
    """sum or mean of x * c is (sum or mean of x) * c: the multiply runs on the reduced result, and the
    reduction sits right after whatever produced x (where reduce_linear can see a linear)."""
    n = program.nodes[nid]
    if n.op not in ("sum", "mean") or n.inputs[0] is None:
        return None
    m = _producer(program, n.inputs[0])
    if m is None or m.op not in ("mul_scalar", "div_scalar") or not single_use(program, n.inputs[0]) \
            or not _float(program, m.inputs[0]) or (m.op == "div_scalar" and m.attrs["value"] == 0):
        return None
    src, out = m.inputs[0], n.outputs[0]
    before, after = _val(program, src).spec.numel, _val(program, out).spec.numel

    def build(p):
        r = p.add_node(n.op, [src], dict(n.attrs)).outputs[0]
        return {out: p.add_node(m.op, [r], dict(m.attrs)).outputs[0]}
    return Rewrite("scale_after_reduction", f"{_n(program, m.id)} moves after {_n(program, nid)}: "
                   f"{before} multiplies become {after}.", build, nid)


def _as_linear(node, w):
    """A stand-in describing matmul(x, W.T) as linear(x, W)."""
    return Node(node.id, "linear", [node.inputs[0], w], node.outputs, {}, node.name)


def reduce_of_broadcast(program: Program, nid: str) -> Rewrite | None:
    """A reduction over dimensions that an expand only repeated: sum is the value times the count,
    mean, max and min are the value itself."""
    n = program.nodes[nid]
    if n.op not in ("sum", "mean", "max", "min") or n.inputs[0] is None:
        return None
    e = _producer(program, n.inputs[0])
    if e is None or e.op != "expand":
        return None
    src = e.inputs[0]
    sshape, eshape = _val(program, src).shape, _val(program, n.inputs[0]).shape
    if len(sshape) != len(eshape):
        return None
    dims = _reduced_dims(n, len(eshape))
    if any(sshape[d] != 1 for d in dims) or not _float(program, src):
        return None
    count = math.prod(eshape[d] for d in dims)
    out = n.outputs[0]
    oshape = _val(program, out).shape
    rest = [d for d in range(len(eshape)) if d not in dims]
    # the result is the source with the reduced dims dropped (or kept as 1) and the others expanded
    if any(sshape[d] != eshape[d] for d in rest):
        return None

    def build(p):
        v = src
        if n.op == "sum":
            v = p.add_node("mul_scalar", [v], {"value": float(count)}).outputs[0]
        if tuple(p.values[v].shape) != tuple(oshape):
            v = _reshape(p, v, oshape)
        return {out: v}
    return Rewrite("reduce_of_broadcast", f"{_n(program, nid)} reduces {count} copies made by "
                   f"{_n(program, e.id)}; it is the value itself{' times ' + str(count) if n.op == 'sum' else ''}.",
                   build, nid)


def matmul_of_transpose(program: Program, nid: str) -> Rewrite | None:
    """a @ w.t() for a matrix w (a similarity matrix x @ y.T, a tied embedding's logits) is linear(a, w):
    cuBLAS and the tile GEMM read w's rows as they lie (k contiguous, as a linear's weight), and no
    kernel writes the transposed copy (uncoalesced, when fused into w's producer)."""
    n = program.nodes[nid]
    if n.op != "matmul" or len(n.inputs) != 2 or None in n.inputs:
        return None
    a, w, out = n.inputs[0], transposed_matrix(program, n.inputs[1]), n.outputs[0]
    if w is None or not _val(program, a).shape or not all(_float(program, v) for v in (a, w)):
        return None

    def build(p):
        return {out: p.add_node("linear", [a, w], name=p.unique_name(n.name)).outputs[0]}
    return Rewrite("matmul_of_transpose", f"{_n(program, nid)} multiplies by the transpose of "
                   f"'{_val(program, w).name}' {list(_val(program, w).shape)}: it is linear with that matrix as the "
                   f"weight, read in place (k contiguous) with no transposed copy.", build, nid)


DEFAULT_RULES = [raise_attention, lower_loss, lower_einsum, drop_noop, merge_equal_nodes, merge_equal_views, reduce_size_one, fold_constants, fold_scalar_chain, fold_self_add,
                 log_of_softmax, merge_max_windows,
                 fold_batch_norm, fold_affine_into_producer, scale_after_reduction, reduce_linear,
                 reduce_conv_spatial, pool_linear,
                 reduce_of_broadcast, matmul_of_transpose, merge_gated_linears, skinny_linear,
                 reduce_of_thin_cat, pointwise_of_thin_cat]
# after the rules above are done: they fold batch norms and affine maps into a convolution's bias,
# which must be there first, and see through nothing between the convolution and what follows
LATE_RULES = [bias_into_epilogue]
