"""Reductions only the row graph (rowgraph.py, rendered by rowkernel.py) generates: argmax / argmin as
a (value, index) combiner, and the p-norms (`norm`, `normalize`) decomposed into the existing states.

States extend rowstates.STATES. An *indexed* state's fold also takes the element's index along the
row (`c`, the flattened index of the reduced dims), so its fields are not all floats:

  argmax, argmin   v (float), i (long long): torch's order decides every fold and combine, so the
                   result does not depend on how the row was split across threads, warps, blocks or
                   a cluster: NaN beats every number (for argmax and argmin alike), otherwise the
                   larger (smaller) value wins, and ties (NaN with NaN, equal values, -0.0 with 0.0)
                   go to the smaller index: the first occurrence, as torch.

A norm folds a per-element transform of its input into a float state (`fold` below is that
transform, written over `xe`): p = 2 the sum of squares, then sqrtf; p = 1 the sum of |x|; p = inf
(-inf) the max (min) of |x|; p = 0 the count of non-zeros; any other p the sum of |x|^p, then the
1/p power (torch.linalg.vector_norm). `normalize` (F.normalize) is x / max(norm, eps), row-preserving.
"""
from __future__ import annotations

import math

from ..ir import Program
from ..ops.common import norm_dim, norm_dims
from .cuda import c_type, float_literal
from .kernel import CodegenError
from .rowstates import STATES as ROW_STATES, row_op

NO_INDEX = "0x7fffffffffffffffLL"   # the empty candidate's index: loses every tie


def _better(op: str) -> str:
    """The C test `a at ia beats b at ib` under torch's argmax / argmin order."""
    return (f"(a != a) ? (b == b || ia < ib) : (b != b) ? false : "
            f"(a {'>' if op == 'argmax' else '<'} b || (a == b && ia < ib))")


def _arg_state(op: str):
    worst = "-INFINITY" if op == "argmax" else "INFINITY"
    # fold and combine call better_<op>, emitted with the state (state_helpers)
    return (["v", "i"], f"{{{worst}, {NO_INDEX}}}",
            f"if (better_{op}(x, c, s.v, s.i)) {{ s.v = x; s.i = c; }}",
            f"return better_{op}(b.v, b.i, a.v, a.i) ? b : a;")


# isum: sum's fold in int64 fields, as torch sums integers and booleans (mask.sum() counts tokens)
STATES = {**ROW_STATES, "argmax": _arg_state("argmax"), "argmin": _arg_state("argmin"), "isum": ROW_STATES["sum"]}
INDEXED = ("argmax", "argmin")          # states whose fold takes the element's index c
NOT_FLOAT = (*INDEXED, "isum")          # states that cannot travel through a float workspace
GRAPH_OPS = ("argmax", "argmin", "norm", "normalize")


def field_ctype(state: str, f: str) -> str:
    return "long long" if (state in INDEXED and f == "i") or state == "isum" else "float"


def struct_fields(state: str) -> str:
    """The C member declarations of a state: `float v; long long i;`."""
    return " ".join(f"{field_ctype(state, f)} {f};" for f in STATES[state][0])


PAIRED = ("softdot",)                   # states whose fold also takes a second value, y (Step.arg2)


def fold_params(state: str) -> str:
    return "float x, long long c" if state in INDEXED else "long long x" if state == "isum" else \
        "float x, float y" if state in PAIRED else "float x"


def state_helpers(state: str) -> str:
    """Functions a state's fold and combine call (the argmax / argmin order)."""
    if state not in INDEXED:
        return ""
    return (f"// torch's {state} order: NaN beats every number; otherwise the "
            f"{'larger' if state == 'argmax' else 'smaller'} value; ties go to the smaller index.\n"
            f"__device__ __forceinline__ bool better_{state}(float a, long long ia, float b, long long ib) {{\n"
            f"  return {_better(state)};\n}}\n")


def _norm_parts(p: float):
    """(state, fold transform over xe, the norm over the state's fields) of a p-norm."""
    if p == 2:
        return "sumsq", None, "sqrtf(st.q)"     # the state squares its input itself
    if p == 1:
        return "sum", "fabsf(xe)", "st.s"
    if p == math.inf:
        return "max", "fabsf(xe)", "st.m"
    if p == -math.inf:
        return "min", "fabsf(xe)", "st.m"
    if p == 0:
        return "sum", "(xe != 0.0f ? 1.0f : 0.0f)", "st.s"
    return "sum", f"powf(fabsf(xe), {float_literal(p)})", f"powf(st.s, {float_literal(1.0 / p)})"


def graph_op(program: Program, nid: str):
    """rowstates.row_op's tuple (state, preamble, expression over the state, preserves rows, reduced
    dims, row length) plus the transform folded instead of the input (None: the input itself) and
    the C type of the op's output."""
    node = program.nodes[nid]
    x = program.values[node.inputs[0]]
    rank, a, op = len(x.shape), node.attrs, node.op
    if op in ("group_norm", "instance_norm"):
        # (sample, group) rows: the row graph sees the input as [N, G, C / G, *S] (rowgraph.group_frame),
        # where a channel parameter is an operand broadcast over that frame, read at the element's column
        return (*row_op(program, nid, channel="[col]"), None, "float")
    if op == "sum" and program.values[node.outputs[0]].dtype == "int64" and x.dtype != "float32":
        c_type(x.dtype, f"'{x.name}'")           # an integer or bool input, summed exactly
        return ("isum", *row_op(program, nid)[1:], None, "long long")
    if op not in GRAPH_OPS:
        return (*row_op(program, nid), None, "float")
    if op in ("argmax", "argmin"):     # a scalar is one row of one element (rowgraph.lower)
        dims = (list(range(rank)) or [0]) if a["dim"] is None else [norm_dim(a["dim"], max(rank, 1))]
        state, fold, expr, preserving, ctype = op, None, "st.i", False, "long long"
    elif op == "norm":
        dims = norm_dims(a["dim"], rank)
        state, fold, expr = _norm_parts(float(a["p"]))
        preserving, ctype = False, "float"
    else:   # normalize: x / max(||x||_p, eps) along one dim
        dims = [norm_dim(a["dim"], rank)]
        state, fold, norm = _norm_parts(float(a["p"]))
        expr, preserving, ctype = f"xe / fmaxf({norm}, {float_literal(a['eps'])})", True, "float"
    if not dims or dims != list(range(dims[0], dims[0] + len(dims))):
        raise CodegenError(f"{node.name} ({op}) reduces dims {dims} of {list(x.shape)}, which are not "
                           f"neighbours; no kernel template reduces scattered dims", node_id=nid)
    return state, "", expr, preserving, dims, None, fold, ctype
