"""Reductions and average pools that move in front of a linear map: the map then runs on far less data.

A convolution is linear in its input, so summing (or averaging) its output over spatial axes equals
convolving box sums of the input. For one reduced axis of a conv, kernel offset k reads input position
o*stride - pad + k*dilation for every output position o; summing over o is a sum of the input over a
fixed set of positions (a 0/1 row A[k, :]). So

    sum over the reduced axes of conv(x, W)  =  conv'(A x, W')

where A x contracts each reduced axis of x against its [K, In] indicator (a small matmul), the kernel
offsets of the reduced axes become extra input channels, and conv' is the convolution over the kept
axes only (a linear layer when no spatial axis is kept). The big convolution over the full grid is
never computed. A transposed convolution works the same way with its own position map.

Likewise an average pool over the features of a linear layer, with non-overlapping windows, is the
linear layer with its output rows averaged window by window: a GEMM as many times narrower.
"""
from __future__ import annotations

import math

import numpy as np

from ..analysis.cost import fmt_bytes
from ..ir import Program
from ..ops.common import ntuple
from .edits import Rewrite, add_param, node_label, param_array, producer, reduced_dims, single_use


def _reshape(p: Program, vid: str, shape) -> str:
    if tuple(p.values[vid].shape) == tuple(shape):
        return vid
    return p.add_node("reshape", [vid], {"shape": list(shape)}).outputs[0]


def offset_indicator(transposed: bool, size_in: int, size_out: int, kernel: int, stride: int, pad: int,
                     dil: int) -> np.ndarray:
    """A[k, i] = how often input position i meets kernel offset k over all output positions of one axis."""
    a = np.zeros((kernel, size_in))
    for k in range(kernel):
        if transposed:  # input i writes output i*stride - pad + k*dil
            i = np.arange(size_in)
            o = i * stride - pad + k * dil
            a[k, i[(o >= 0) & (o < size_out)]] = 1.0
        else:           # output o reads input o*stride - pad + k*dil
            i = np.arange(size_out) * stride - pad + k * dil
            a[k, i[(i >= 0) & (i < size_in)]] = 1.0
    return a


def _contract_axis(p: Program, vid: str, axis: int, a: np.ndarray, like: str) -> str:
    """x with `axis` (size In) replaced by the kernel offsets (size K): sum_i A[k, i] x[..., i, ...]."""
    shape = list(p.values[vid].shape)
    pre, size, post = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if post == 1:
        at = add_param(p, p.unique_name("box_sums_t"), a.T, like=like)
        v = p.add_node("matmul", [_reshape(p, vid, (pre, size)), at]).outputs[0]
    else:
        an = add_param(p, p.unique_name("box_sums"), a, like=like)
        v = p.add_node("matmul", [an, _reshape(p, vid, (pre, size, post))]).outputs[0]
    return _reshape(p, v, shape[:axis] + [a.shape[0]] + shape[axis + 1:])


# below this a convolution takes a few microseconds, no more than the launches the rewrite adds
MIN_FLOPS = 1e8


def _profitable(flops_before: float, flops_after: float) -> bool:
    """Worth it when the replacement does under a quarter of the work (the box sums are memory-bound)."""
    return flops_before >= max(MIN_FLOPS, 4 * flops_after)


def reduce_conv_spatial(program: Program, nid: str) -> Rewrite | None:
    """sum or mean over spatial axes of a convolution's output becomes a convolution over the kept
    axes (or a linear layer) of box sums of its input: see the module docstring."""
    n = program.nodes[nid]
    if n.op not in ("sum", "mean") or not n.inputs or n.inputs[0] is None:
        return None
    y = n.inputs[0]
    conv = producer(program, y)
    if conv is None or conv.opdef.category != "convolution" or not single_use(program, y):
        return None
    transposed = conv.op.startswith("conv_transpose")
    d = int(conv.op[-2])
    x, w = conv.inputs[0], conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    xs, ys = program.values[x].shape, program.values[y].shape
    wa = param_array(program, w)
    ba = param_array(program, bias) if bias else None
    if wa is None or (bias and ba is None) or len(xs) != d + 2 or program.values[y].dtype != "float32":
        return None
    axes = reduced_dims(n, len(ys))
    if any(a < 2 for a in axes):
        return None  # only spatial axes: a channel or batch reduction is another rule's business
    a = conv.attrs
    if isinstance(a.get("padding"), str) and a["padding"] != "valid":
        return None
    pad = [0] * d if a.get("padding") == "valid" else ntuple(a["padding"], d, "padding")
    stride, dil = ntuple(a["stride"], d, "stride"), ntuple(a["dilation"], d, "dilation")
    outpad = ntuple(a.get("output_padding", [0]), d, "output_padding")
    groups = a["groups"]
    red = [ax - 2 for ax in axes]                  # reduced spatial axes, 0-based
    kept = [s for s in range(d) if s not in red]
    kernel = wa.shape[2:]
    cin = xs[1]
    cout = ys[1]
    count = math.prod(ys[ax] for ax in axes)
    scale = 1.0 / count if n.op == "mean" else 1.0
    k_red = math.prod(kernel[s] for s in red)
    out = n.outputs[0]
    # the replacement: box sums (the first contraction reads x once) and a map 1/count as big
    flops_before = program.node_flops(conv.id)
    box_flops = 2 * math.prod(xs) * kernel[red[-1]]
    flops_after = box_flops + flops_before / math.prod((xs if transposed else ys)[ax] for ax in axes)
    if not _profitable(flops_before, flops_after):
        return None

    # weights of the smaller map: kernel offsets of the reduced axes join the input channels (ci major)
    W = wa.astype(np.float64) * scale
    kdims = [2 + s for s in red]
    kkept = [2 + s for s in kept]
    if transposed:  # [Cin, Cout/g, K...] -> [Cin, K_red..., Cout/g, K_kept...] -> [Cin*K_red, Cout/g, K_kept...]
        W2 = W.transpose([0, *kdims, 1, *kkept]).reshape(cin * k_red, cout // groups, *[kernel[s] for s in kept])
    else:           # [Cout, Cin/g, K...] -> [Cout, Cin/g * K_red, K_kept...]
        W2 = W.transpose([0, 1, *kdims, *kkept]).reshape(cout, (cin // groups) * k_red, *[kernel[s] for s in kept])
    b2 = None if ba is None else ba.astype(np.float64) * (1.0 if n.op == "mean" else count)
    if not kept:
        dense = np.zeros((cout, cin * k_red))  # a linear layer; groups become a block-diagonal weight
        cin_g, cout_g = cin // groups, cout // groups
        for g in range(groups):
            rows, cols = slice(g * cout_g, (g + 1) * cout_g), slice(g * cin_g * k_red, (g + 1) * cin_g * k_red)
            dense[rows, cols] = W2[cols].T if transposed else W2[rows]
        W2 = dense

    def build(p: Program) -> dict:
        v = x
        for s in sorted(red, reverse=True):
            ind = offset_indicator(transposed, xs[2 + s], ys[2 + s], kernel[s], stride[s], pad[s], dil[s])
            v = _contract_axis(p, v, 2 + s, ind, like=w)
        shape = list(p.values[v].shape)  # [N, Cin, ...] with K at each reduced axis
        order = [0, 1] + kdims + kkept
        if order != list(range(len(shape))):
            v = p.add_node("permute", [v], {"dims": order}).outputs[0]
        w_id = add_param(p, p.unique_name(p.values[w].name + "_box"), W2, like=w)
        ins = [None, w_id]
        if b2 is not None:
            ins.append(add_param(p, p.unique_name(p.values[bias].name + "_box"), b2, like=w))
        if kept:
            ins[0] = _reshape(p, v, [xs[0], cin * k_red] + [xs[2 + s] for s in kept])
            attrs = {"stride": [stride[s] for s in kept], "padding": [pad[s] for s in kept],
                     "dilation": [dil[s] for s in kept], "groups": groups}
            if transposed:
                attrs["output_padding"] = [outpad[s] for s in kept]
            op = f"{'conv_transpose' if transposed else 'conv'}{len(kept)}d"
            r = p.add_node(op, ins, attrs).outputs[0]
        else:
            ins[0] = _reshape(p, v, [xs[0], cin * k_red])
            r = p.add_node("linear", ins).outputs[0]
        return {out: _reshape(p, r, program.values[out].shape)}

    return Rewrite("reduce_conv_spatial",
                   f"{node_label(program, nid)} over axes {axes} of {node_label(program, conv.id)} moves in "
                   f"front of it: box sums of the input ({k_red} per channel) feed a "
                   f"{'smaller convolution' if kept else 'linear layer'}, so the {fmt_bytes(program.values[y].nbytes)} "
                   f"convolution output is never computed (about {flops_before / 1e9:.3g} GFLOP become "
                   f"{flops_after / 1e9:.3g}).", build, nid)


def _through_reshapes(program: Program, vid: str):
    """The node that computes vid, looking through single-use reshapes; with the value it produced."""
    node = producer(program, vid)
    while node is not None and node.op in ("reshape", "unsqueeze", "squeeze", "view", "flatten") \
            and single_use(program, node.inputs[0]):
        vid = node.inputs[0]
        node = producer(program, vid)
    return node, vid


def pool_linear(program: Program, nid: str) -> Rewrite | None:
    """avg_pool1d over the output features of a linear layer (no padding) is the linear layer with its
    weight rows and bias averaged window by window: the GEMM gets kernel/stride times narrower."""
    n = program.nodes[nid]
    if n.op != "avg_pool1d" or not n.inputs or n.inputs[0] is None:
        return None
    a = n.attrs
    k = ntuple(a["kernel_size"], 1, "kernel_size")[0]
    s = ntuple(a["stride"] or k, 1, "stride")[0]
    if ntuple(a["padding"], 1, "padding")[0] != 0 or a.get("ceil_mode") or a.get("divisor_override"):
        return None
    lin, y = _through_reshapes(program, n.inputs[0])
    if lin is None or not single_use(program, y) or program.values[y].dtype != "float32":
        return None
    if lin.op == "linear":
        w, bias = lin.inputs[1], (lin.inputs[2] if len(lin.inputs) > 2 else None)
        wa = param_array(program, w)               # [N, K]
    elif lin.op == "matmul" and param_array(program, lin.inputs[1]) is not None:
        w, bias = lin.inputs[1], None
        wa = param_array(program, w)
        wa = wa.T if wa is not None and wa.ndim == 2 else None  # x @ W with W [K, N]
    else:
        return None
    ba = param_array(program, bias) if bias else None
    if wa is None or wa.ndim != 2 or (bias and ba is None):
        return None
    pooled_in = program.values[n.inputs[0]].shape
    if pooled_in[-1] != wa.shape[0] or math.prod(pooled_in) != math.prod(program.values[y].shape):
        return None  # the pool must run over the linear layer's output features
    features = wa.shape[0]
    starts = range(0, features - k + 1, s)
    W = np.stack([wa[j:j + k].astype(np.float64).mean(axis=0) for j in starts])
    b = None if ba is None else np.array([ba[j:j + k].astype(np.float64).mean() for j in starts])
    out = n.outputs[0]

    def build(p: Program) -> dict:
        ins = [lin.inputs[0], add_param(p, p.unique_name(p.values[w].name + "_pooled"), W, like=w)]
        if b is not None:
            ins.append(add_param(p, p.unique_name(p.values[bias].name + "_pooled"), b, like=w))
        r = p.add_node("linear", ins).outputs[0]
        return {out: _reshape(p, r, program.values[out].shape)}
    return Rewrite("pool_linear", f"{node_label(program, nid)} (window {k}, stride {s}) averages the "
                   f"{features} output features of {node_label(program, lin.id)}; averaging its weight rows "
                   f"instead makes it {len(starts)} features wide, a {features / len(starts):.3g}x smaller GEMM.",
                   build, nid)
