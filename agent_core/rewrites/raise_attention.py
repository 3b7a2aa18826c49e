"""Written-out attention raised to one scaled_dot_product_attention node: the inverse of
lowering.lower_attention, so the planner sees attention however the user spelled it.

Matched at the softmax, the chain is

    scores = q @ k^T        matmul, bmm, einsum ('...ld,...sd->...ls' or '...ld,...ds->...ls'), or
                            baddbmm(mask, q, k^T) (nn.MultiheadAttention with an attn_mask)
    [scale]                 mul_scalar / div_scalar anywhere on the scores, or on q or k beforehand
    [mask]                  where(hide, -inf, s) (masked_fill), where(keep, s, -inf), masked_fill(s, hide,
                            -inf), or s + float mask
    p = softmax(scores, -1)
    [dropout, identity]     eval mode
    out = p @ v             matmul, bmm or einsum ('...ls,...sd->...ld')

and becomes sdpa(q, k, v, mask, scale). ReLU or sigmoid attention, the same chain with relu or sigmoid in
the softmax's place (its scores unnormalised), becomes sdpa(..., score="relu" / "sigmoid") when q, k and
v are all activations (an activation between two products with weights is an MLP, not attention).

A mask that evaluates to a constant equal to torch's is_causal (keep key j for query i when j <= i,
torch.ones(L, S).tril()) becomes is_causal and disappears; any other mask is kept as attn_mask. Where a
mask may hide a whole row, the written-out softmax gives NaN for it and torch's SDPA gives zeros: the
replacement puts the NaNs back (a where on the rows no key reaches), so it equals the original exactly
(relu and sigmoid give zeros either way).

The rule fires only when every intermediate (the scores, each step on them, the probabilities) is read
by the next step alone, the values are float32, and our fused kernel takes the new node
(codegen.attention.attention_supported): otherwise lower_attention would write it out again and the two
rules would undo each other. The engine checks the result numerically like any rewrite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..analysis.cost import fmt_bytes
from ..errors import ProgramError
from ..ir import Program, Role
from ..reference import run_node
from .edits import Rewrite, param_array, producer, single_use
from .lowering import lower_loss

SDPA = "scaled_dot_product_attention"
SCALES = ("mul_scalar", "div_scalar")
PASS_THROUGH = ("dropout", "identity", "contiguous")   # eval mode: the probabilities unchanged
POINTWISE = ("relu", "sigmoid")    # elementwise scores SDPA's `score` takes (unnormalised attention)
CONSTANT_LIMIT = 64 * 2**20   # a mask up to this size is evaluated here to see whether it is causal


@dataclass
class _Scores:
    """What the walk from the softmax back to q @ k^T found."""
    q: str
    k: str | None                 # [..., S, E], or None when only k^T is at hand (kt)
    kt: str | None
    scale: float = 1.0
    mask: str | None = None       # the mask value as written: hide / keep (bool) or add (float)
    mask_kind: str | None = None  # "hide", "keep" or "add"
    mask_factor: float = 1.0      # scalar factors applied after an additive mask (they scale it too)
    nodes: list = field(default_factory=list)


def _scalar(node) -> float | None:
    """The factor of a mul_scalar / div_scalar node (None for any other node or a zero divisor)."""
    if node is None or node.op not in SCALES:
        return None
    v = float(node.attrs["value"])
    if node.op == "div_scalar":
        return None if v == 0 else 1.0 / v
    return v


def _einsum_form(equation: str) -> str | None:
    """'nn' when the einsum is a (batched) a @ b, 'nt' when it is a @ b^T, else None."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    ops = lhs.split(",")
    if len(ops) != 2:
        return None
    a, b = ops
    if not (len(a) == len(b) == len(out) >= 2) or len(set(a)) != len(a) or len(set(b)) != len(b):
        return None
    if a[:-2] != b[:-2] or a[:-2] != out[:-2]:
        return None
    x, y = a[-2:]
    if out[-2] != x or out[-1] in (x, y):
        return None
    z = out[-1]
    if b[-2:] == y + z:
        return "nn"
    if b[-2:] == z + y:
        return "nt"
    return None


def _product(node) -> tuple[str, str, bool] | None:
    """(a, b, b_transposed) when node is a matrix product of two operands of rank >= 2."""
    if node is None:
        return None
    if node.op in ("matmul", "bmm") and len(node.inputs) == 2:
        return node.inputs[0], node.inputs[1], False
    if node.op == "einsum" and len(node.inputs) == 2:
        form = _einsum_form(node.attrs["equation"])
        return None if form is None else (node.inputs[0], node.inputs[1], form == "nt")
    return None


def _is_neg_inf(program: Program, vid: str) -> bool:
    arr = param_array(program, vid)
    return arr is not None and arr.size > 0 and bool(np.isneginf(arr).all())


def _last_two_swapped(program: Program, node) -> bool:
    """Whether node is a transpose (or permute) that swaps the last two dims and nothing else."""
    if node is None:
        return False
    rank = len(program.values[node.inputs[0]].shape)
    if node.op == "transpose":
        return rank >= 2 and {node.attrs["dim0"] % rank, node.attrs["dim1"] % rank} == {rank - 2, rank - 1}
    if node.op == "permute":
        return [d % rank for d in node.attrs["dims"]] == list(range(rank - 2)) + [rank - 1, rank - 2]
    return False


def _pre_scaled(program: Program, vid: str) -> tuple[str, float]:
    """q or k (or k^T) without the scalar factors applied to it alone: (source, factor)."""
    factor = 1.0
    while single_use(program, vid):
        node = producer(program, vid)
        c = _scalar(node)
        if c is None:
            break
        factor *= c
        vid = node.inputs[0]
    return vid, factor


def _walk_scores(program: Program, vid: str, shape: tuple, after: float = 1.0, mask=None,
                 steps=()) -> _Scores | None:
    """From the softmax's input back to q @ k^T through scale and mask steps. `after` is the product of
    the scalar factors between vid and the softmax, `mask` the (kind, value, factor after it) found."""
    if not single_use(program, vid) or tuple(program.values[vid].shape) != shape:
        return None
    node = producer(program, vid)
    if node is None:
        return None
    steps = steps + (node.id,)
    c = _scalar(node)
    if c is not None:
        return _walk_scores(program, node.inputs[0], shape, after * c, mask, steps)
    if mask is None and node.op == "where" and len(node.inputs) == 3 and after > 0:
        cond, a, b = node.inputs     # -inf stays -inf only under a positive factor
        if program.values[cond].dtype != "bool":
            return None
        if _is_neg_inf(program, a):
            return _walk_scores(program, b, shape, after, ("hide", cond, 1.0), steps)
        if _is_neg_inf(program, b):
            return _walk_scores(program, a, shape, after, ("keep", cond, 1.0), steps)
        return None
    if mask is None and node.op == "masked_fill" and node.attrs["value"] == float("-inf") and after > 0:
        return _walk_scores(program, node.inputs[0], shape, after, ("hide", node.inputs[1], 1.0), steps)
    if mask is None and node.op == "add" and len(node.inputs) == 2 and after > 0:
        for chain, other in (node.inputs, node.inputs[::-1]):   # which operand carries the scores
            if chain != other and program.values[other].dtype == "float32":
                found = _walk_scores(program, chain, shape, after, ("add", other, after), steps)
                if found is not None:
                    return found
        return None
    if node.op == "baddbmm" and mask is None:
        m, a, b = node.inputs                      # beta * m + alpha * a @ b
        beta = float(node.attrs["beta"])
        found = _finish(program, a, b, False, after * float(node.attrs["alpha"]), steps)
        if found is not None and beta != 0:
            if program.values[m].dtype != "float32" or beta * after <= 0:
                return None
            found.mask, found.mask_kind, found.mask_factor = m, "add", beta * after
        return found
    prod = _product(node)
    if prod is None:
        return None
    found = _finish(program, *prod, after, steps)
    if found is not None and mask is not None:
        found.mask_kind, found.mask, found.mask_factor = mask
    return found


def _finish(program, a, b, b_transposed, factor, steps) -> _Scores | None:
    """The Scores of q @ b (b = k^T) or q @ b^T (b = k), folding pre-scaled operands into the factor."""
    q, fq = _pre_scaled(program, a)
    b, fb = _pre_scaled(program, b)
    k, kt = (b, None) if b_transposed else (None, b)
    t = producer(program, kt) if kt is not None else None
    if kt is not None and single_use(program, kt) and _last_two_swapped(program, t):
        k, fk = _pre_scaled(program, t.inputs[0])
        kt, fb = None, fb * fk
    if len(program.values[q].shape) < 2:
        return None
    return _Scores(q, k, kt, factor * fq * fb, nodes=list(steps))


def _probabilities_consumer(program: Program, p: str):
    """The p @ v node reading the probabilities (through eval dropouts), and the nodes passed."""
    passed = []
    while single_use(program, p):
        (cid,) = {c for c, _ in program.consumers(p)}
        node = program.nodes[cid]
        if node.op in PASS_THROUGH and program.values[node.outputs[0]].spec == program.values[p].spec:
            passed.append(cid)
            p = node.outputs[0]
            continue
        prod = _product(node)
        if prod is None or prod[0] != p or prod[1] == p:
            return None, passed
        return node, passed
    return None, passed


# --- masks ------------------------------------------------------------------------------------
def _constant(program: Program, vid: str, depth: int = 24) -> np.ndarray | None:
    """The value of vid when it is computed from parameters and constants alone (a tril buffer sliced
    and compared, torch.ones(T, T).tril(), arange arithmetic), else None."""
    arr = param_array(program, vid)
    if arr is not None:
        return arr
    node = producer(program, vid)
    if node is None or depth == 0 or node.opdef.category == "opaque" or len(node.outputs) != 1 \
            or program.values[vid].nbytes > CONSTANT_LIMIT:
        return None
    env = {}
    for v in node.inputs:
        if v is None:
            continue
        a = _constant(program, v, depth - 1)
        if a is None:
            return None
        env[v] = torch.from_numpy(np.ascontiguousarray(a))
    with torch.no_grad():
        run_node(program, node.id, env)
    return env[vid].cpu().numpy()


def _keep(kind: str, arr: np.ndarray) -> np.ndarray | None:
    """Which scores a constant mask keeps (bool), or None for an additive mask that adds other values
    than 0 and -inf (it is a bias, not only a mask)."""
    if kind == "keep":
        return arr.astype(bool)
    if kind == "hide":
        return ~arr.astype(bool)
    if not (np.isneginf(arr) | (arr == 0)).all():
        return None
    return ~np.isneginf(arr)


def _causal(keep: np.ndarray, L: int, S: int) -> bool:
    """Whether the keep pattern, broadcast to [..., L, S], is torch's is_causal everywhere."""
    try:
        full = np.broadcast_to(keep, keep.shape[:-2] + (L, S)) if keep.ndim >= 2 else np.broadcast_to(keep, (L, S))
    except ValueError:
        return False
    return bool((full == np.tril(np.ones((L, S), dtype=bool))).all())


def _hides_a_row(keep: np.ndarray) -> bool:
    """Whether some row of a constant keep pattern keeps no key."""
    keep = np.atleast_1d(keep)
    return keep.size > 0 and not bool(keep.any(axis=-1).all())


def _dead_rows(program: Program, mask: str, kind: str) -> str:
    """A bool value [..., L, 1], true on the rows where the mask hides every key."""
    def add(op, ins, **attrs):
        return program.add_node(op, list(ins), attrs).outputs[0]
    if kind == "add":
        ninf = program.add_parameter(program.unique_name("neg_inf"), np.array(-np.inf, dtype=np.float32),
                                     constant=True).id
        return add("eq", [add("max", [mask], dim=[-1], keepdim=True), ninf])
    keep = mask if kind == "keep" else add("logical_not", [mask])
    kept = add("max", [add("cast", [keep], dtype="float32")], dim=[-1], keepdim=True)
    return add("logical_not", [add("cast", [kept], dtype="bool")])


# --- the rule ---------------------------------------------------------------------------------
def _supported(program: Program, nid: str) -> str | None:
    """Why our fused attention kernel does not take node nid, or None when it does."""
    try:
        from ..codegen.attention import attention_supported   # lazy: the rewrites load without codegen
    except ModuleNotFoundError as e:
        if e.name != "agent_core.codegen.attention":
            raise
        return "this build has no fused attention kernel (agent_core.codegen.attention)"
    return attention_supported(program, nid)


def raise_attention(program: Program, nid: str) -> Rewrite | None:
    """softmax(q @ k^T * scale + mask) @ v written out becomes one scaled_dot_product_attention node,
    relu(...) @ v or sigmoid(...) @ v one with that score (see the module docstring for the spellings)."""
    n = program.nodes[nid]
    if n.op not in ("softmax",) + POINTWISE or not n.inputs or n.inputs[0] is None:
        return None
    elementwise = n.op in POINTWISE
    s, p = n.inputs[0], n.outputs[0]
    shape = tuple(program.values[s].shape)
    if len(shape) < 2 or program.values[s].dtype != "float32" or \
            (not elementwise and n.attrs["dim"] % len(shape) != len(shape) - 1):
        return None
    pv, passed = _probabilities_consumer(program, p)
    if pv is None:
        return None
    _, v, v_transposed = _product(pv)
    sc = _walk_scores(program, s, shape)
    if sc is None:
        return None
    vals = program.values
    ins = [sc.q, sc.k or sc.kt, v] + ([sc.mask] if sc.mask else [])
    if any(vals[x].dtype != "float32" for x in ins[:3]) or any(len(vals[x].shape) < 2 for x in ins[:3]):
        return None
    if sc.mask and vals[sc.mask].dtype not in ("bool", "float32"):
        return None
    if elementwise and any(vals[x].role in (Role.PARAMETER, Role.CONSTANT) for x in ins[:3]):
        return None
    out = pv.outputs[0]
    L, S = shape[-2:]
    # a row the mask hides entirely: NaN from the written-out softmax, zeros from relu or sigmoid (and ours)
    causal, dead_possible, how = False, sc.mask is not None and not elementwise, "no mask"
    if sc.mask is not None:
        what = "additive mask" if sc.mask_kind == "add" else "bool mask"
        arr = _constant(program, sc.mask)
        keep = _keep(sc.mask_kind, arr) if arr is not None else None
        if keep is not None and _causal(keep, L, S):
            causal, dead_possible, how = True, False, f"a constant causal {what} (is_causal)"
        elif arr is not None:
            if keep is None:     # a bias with other values than 0 and -inf
                keep = ~np.isneginf(arr)
            dead_possible = not elementwise and _hides_a_row(keep)
            how = f"a constant {what} kept as attn_mask"
        else:
            how = f"a computed {what} kept as attn_mask"
    scale = sc.scale
    batch = shape[:-2]
    scores_size = fmt_bytes(4 * math.prod(shape))

    def build(prog):
        def add(op, inputs, **attrs):
            return prog.add_node(op, list(inputs), attrs).outputs[0]
        k = sc.k if sc.k is not None else add("transpose", [sc.kt], dim0=-2, dim1=-1)
        vv = add("transpose", [v], dim0=-2, dim1=-1) if v_transposed else v
        mask = None
        if sc.mask is not None and not causal:
            mask = sc.mask
            if sc.mask_kind == "hide":
                mask = add("logical_not", [mask])
            elif sc.mask_kind == "add" and sc.mask_factor != 1.0:
                mask = add("mul_scalar", [mask], value=sc.mask_factor)
        node = prog.add_node(SDPA, [sc.q, k, vv] + ([mask] if mask else []),
                             {"is_causal": causal, "scale": scale, "score": n.op}, name="attention")
        o = node.outputs[0]
        if tuple(prog.values[o].shape) != tuple(vals[out].shape):
            raise ProgramError(f"attention would make {list(prog.values[o].shape)}, not {list(vals[out].shape)}")
        why = _supported(prog, node.id)
        if why:
            raise ProgramError(f"our fused attention kernel does not take it: {why}")
        if lower_loss(prog, node.id) is not None:   # the two rules would undo each other every round
            raise ProgramError("the lowering rule (lower_attention) would write it out again")
        if dead_possible:   # the written-out softmax gives NaN on a row with every key masked
            nan = prog.add_parameter(prog.unique_name("nan"), np.array(np.nan, dtype=np.float32), constant=True).id
            o = add("where", [_dead_rows(prog, mask, "add" if sc.mask_kind == "add" else "keep"), nan, o])
        return {out: o}
    steps = len(sc.nodes) + 1 + len(passed) + 1
    return Rewrite("raise_attention",
                   f"{n.name} ({n.op} over {S} keys) with the products around it is "
                   f"{n.op + ' ' if elementwise else ''}attention written out "
                   f"({steps} ops, {list(batch)} x {L}x{S} scores, {scores_size}): q @ k^T scaled by {scale:.6g}, "
                   f"{how}, {n.op}, @ v; it becomes one {SDPA} node{f' (score {n.op})' if elementwise else ''}, which our "
                   f"fused kernel runs without "
                   "storing the scores" + ("; rows the mask hides entirely stay NaN, as written" if dead_possible
                                           else "") + ".", build, nid)
