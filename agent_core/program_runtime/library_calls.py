"""Library calls that write into the arena (library_memory says which, and where).

The same calls and summation orders as runtime.split_tf32 (the verified forms), with torch's out=
variants writing into arena views, and the split-TF32 parts made in place in arena temporaries:
hi = round(x) and lo = round(x - hi) through integer views, so no torch temporary is allocated.
"""
from __future__ import annotations

from ..ir import Program
from ..runtime.split_tf32 import (CHANNELS_LAST, TF32X3, TF32X3_CAT, _cached, _cached_split, _is_parameter,
                                  _operands, _run_form, library_layout, library_precision, run_in_layout,
                                  run_library_node, split_cat_into, split_into, tf32_tensor_cores,
                                  weight_cat)

def _linear_into(x, w, bias, out, extra=()) -> None:
    """out = x @ w.T + bias (then += each (x', w') of extra), as cuBLAS GEMMs into out."""
    import torch
    k, n = x.shape[-1], w.shape[0]
    x2, o2 = x.reshape(-1, k), out.view(-1, n)
    if bias is not None and bias.dim() <= 1:
        torch.addmm(bias, x2, w.t(), out=o2)
    else:
        torch.mm(x2, w.t(), out=o2)
    for xe, we in extra:
        o2.addmm_(xe.reshape(-1, k), we.t())
    if bias is not None and bias.dim() > 1:
        out.add_(bias)


def fp32_into(node, args, out) -> None:
    """The node's fp32 call (ops/matmul.py's reference) writing into out."""
    import torch
    op, at = node.op, node.attrs
    if op == "linear":
        _linear_into(args[0], args[1], args[2] if len(args) > 2 else None, out)
    elif op == "matmul":
        torch.matmul(args[0], args[1], out=out)
    elif op == "bmm":
        torch.bmm(args[0], args[1], out=out)
    elif op == "addmm":
        torch.addmm(args[0], args[1], args[2], beta=at.get("beta", 1), alpha=at.get("alpha", 1), out=out)
    elif op == "baddbmm":
        torch.baddbmm(args[0], args[1], args[2], beta=at.get("beta", 1), alpha=at.get("alpha", 1), out=out)
    else:
        raise ValueError(f"{op} has no out= form here")


def _gemm_sum_into(op, a_hi, a_lo, b_hi, b_lo, bias, out) -> None:
    """split_tf32._gemm_sum's three products, in its order, into out."""
    if op == "linear":
        _linear_into(a_hi, b_hi, bias, out, extra=((a_lo, b_hi), (a_hi, b_lo)))
        return
    import torch
    mm, acc = (torch.mm, "addmm_") if a_hi.dim() == 2 else (torch.bmm, "baddbmm_")
    mm(a_lo, b_hi, out=out)
    getattr(out, acc)(a_hi, b_lo)
    getattr(out, acc)(a_hi, b_hi)


def _run_split(program: Program, nid: str, env: dict, views: dict, cached: bool) -> None:
    node = program.nodes[nid]
    a, b, bias = _operands(node, env)

    def parts(name, vid, t):
        if cached and _is_parameter(program, vid):
            return _cached_split(t)
        hi, lo = views[f"{nid}.{name}_hi"], views[f"{nid}.{name}_lo"]
        split_into(t, hi, lo)
        return hi, lo
    a_hi, a_lo = parts("a", node.inputs[0], a)
    b_hi, b_lo = parts("b", node.inputs[1], b)
    out = views.get(node.outputs[0])
    with tf32_tensor_cores():
        if out is not None:
            _gemm_sum_into(node.op, a_hi, a_lo, b_hi, b_lo, bias, out)
        else:
            ref, attrs = node.opdef.reference, node.attrs
            out = ref([a_lo, b_hi, None], attrs)      # the small terms first (split_tf32's order)
            out += ref([a_hi, b_lo, None], attrs)
            out += ref([a_hi, b_hi, bias], attrs)
    env[node.outputs[0]] = out


def _run_split_cat(program: Program, nid: str, env: dict, views: dict, cached: bool) -> None:
    node = program.nodes[nid]
    a, b, bias = _operands(node, env)
    spatial = int(node.op[-2])
    channel = a.dim() - spatial - 1
    w_dim = 0 if node.op.startswith("conv_transpose") else 1
    a_cat = views[f"{nid}.a_cat"]
    split_cat_into(a, a_cat, channel, lo_at=1)
    if cached and _is_parameter(program, node.inputs[1]):
        w_cat = _cached(b, "cat", lambda w: weight_cat(w, w_dim))
    else:
        w_cat = views[f"{nid}.w_cat"]
        split_cat_into(b, w_cat, w_dim, lo_at=2)
    with tf32_tensor_cores():
        env[node.outputs[0]] = node.opdef.reference([a_cat, w_cat, bias], node.attrs)


def _fp32(program: Program, nid: str, env: dict) -> None:
    from ..reference import run_node
    run_node(program, nid, env)


def run_library_call(program: Program, nid: str, env: dict, views: dict, decisions: dict) -> None:
    """Run one library or torch node: into its arena slot when it has one, split TF32 as decided
    (library_memory.MemoryDecision), else exactly as runtime.split_tf32.run_library_node."""
    node = program.nodes[nid]
    d = decisions.get(nid)
    form = library_precision(program).get(nid)
    if d is not None and d.runs_as == "fp32":
        form = None
    if library_layout(program).get(nid) == CHANNELS_LAST:
        # torch allocates a channels-last call's output and split parts (the arena's are contiguous;
        # convolutions keep torch's allocation anyway); a form the memory plan demoted runs fp32
        run = _run_form if form is not None else _fp32
        run_in_layout(program, nid, env, run, CHANNELS_LAST)
        return
    if d is not None and form == TF32X3:
        _run_split(program, nid, env, views, d.weights == "cached")
        return
    if d is not None and form == TF32X3_CAT:
        _run_split_cat(program, nid, env, views, d.weights == "cached")
        return
    out = views.get(node.outputs[0]) if len(node.outputs) == 1 else None
    if out is not None and form in (None, "fp32"):
        fp32_into(node, [env[v] if v is not None else None for v in node.inputs], out)
        env[node.outputs[0]] = out
        return
    if form is None and d is not None:           # demoted to fp32, output kept by torch
        from ..reference import run_node
        run_node(program, nid, env)
        return
    run_library_node(program, nid, env)
