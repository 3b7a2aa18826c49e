"""Programs with integer and bool operands, shared by tests/test_codegen_int_inputs.py (host run,
NVRTC compile, planning) and tests/gpu/test_gpu_int_inputs.py (verified on the GPU).

Values are drawn to expose a lossy conversion: int64 around 2^24 + 1 and 2^40 (not exact in float32),
-100 (ignore_index), and uint8 / int8 values whose sums and differences wrap."""
from __future__ import annotations

import numpy as np
import torch

from agent_core.ir import Program

DTYPES = ("int64", "int32", "uint8", "int8", "bool")
SHAPE = (3, 67)          # 201 elements: a vector body of 50 groups and a scalar tail of 1
TORCH = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
         "int8": torch.int8, "bool": torch.bool}


def _const(p, name, value, dtype):
    return p.add_parameter(name, np.array(value, dtype={"int64": np.int64, "int32": np.int32, "uint8": np.uint8,
                                                        "int8": np.int8, "bool": np.bool_,
                                                        "float32": np.float32}[dtype]), constant=True)


def every_int_op(dtype: str):
    """One pointwise region over a, b (dtype; b broadcast over rows), c (float32) and cond (bool) that
    writes every op torch defines on dtype as its own output: the program and the region's node ids."""
    p = Program(f"int_ops_{dtype}")
    a = p.add_input("a", SHAPE, dtype)
    b = p.add_input("b", SHAPE[-1:], dtype)
    c = p.add_input("c", SHAPE)
    cond = p.add_input("cond", SHAPE, "bool")
    k = _const(p, "k", -100 if dtype in ("int64", "int32", "int8") else 1, dtype)
    ids = []

    def op(name, ins, attrs=None):
        n = p.add_node(name, [v.id if hasattr(v, "id") else v for v in ins], attrs or {})
        p.mark_output(n.outputs[0])
        ids.append(n.id)
        return n.outputs[0]

    integer = dtype != "bool"
    for name in ("add", "mul", "maximum", "minimum", "gt", "ge", "lt", "le", "eq", "ne", "logical_and",
                 "logical_or"):
        op(name, [a, b])
    op("eq", [a, k])                         # labels == -100: compared in dtype
    op("where", [cond, a, k])
    op("masked_fill", [a, cond], {"value": -100 if dtype in ("int64", "int32", "int8") else 1})
    op("mul", [a, c])                        # promoted to float32: a converted, then multiplied
    op("add", [c, a])
    op("where", [cond, a, c])
    op("cast", [a], {"dtype": "float32"})
    op("cast", [c], {"dtype": "int64"})
    op("logical_not", [a])
    op("identity", [a])
    op("zeros_like", [a])
    op("full_like", [a], {"fill_value": 7})
    op("exp", [a])                           # a float op on an integer: float32(a) first
    op("div", [a, b]) if integer else None
    op("square", [a])                        # wraps as torch does on overflow
    op("max_scalar", [a], {"value": 3})
    op("mul_scalar", [a], {"value": 2.5})   # a Python float makes it float32
    if integer:
        for name in ("sub", "remainder", "fmod"):
            op(name, [a, b])
        for name in ("neg", "abs", "sign", "relu", "relu6", "floor", "round"):
            op(name, [a])
        op("add_scalar", [a], {"value": 5})
        op("rsub_scalar", [a], {"value": 3})
        op("mul_scalar", [a], {"value": 3})
        op("min_scalar", [a], {"value": -2})
        op("clamp", [a], {"min": -5, "max": 100})
        op("clamp", [a], {"min": 2})
    return p, ids


def draw(p: Program, seed: int = 0) -> dict:
    """Inputs by value id: integer values beyond float32's 2^24, -100s, wrap-around bytes; b nonzero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for vid in p.inputs:
        v = p.values[vid]
        shape, dt = tuple(v.shape), v.dtype
        if dt == "float32":
            t = torch.randn(shape, generator=g)
        elif dt == "bool":
            t = torch.rand(shape, generator=g) < 0.5
        else:
            lo, hi = {"int64": (-2**41, 2**41), "int32": (-2**30, 2**30), "uint8": (0, 256), "int8": (-128, 128)}[dt]
            if v.name in ("b", "mask", "attention_mask"):
                lo, hi = (1, 250) if dt == "uint8" else (-9, 10) if v.name == "b" else (0, 2)
            t = torch.randint(lo, hi, shape, generator=g, dtype=TORCH[dt])
            if v.name == "b":
                t[t == 0] = 3
            if dt in ("int64", "int32") and v.name not in ("mask", "attention_mask"):
                flat = t.view(-1)
                flat[::5] = -100                   # ignore_index labels
                flat[1::7] = 2**24 + 1            # the first integer float32 cannot hold
        out[vid] = t
    return out


def cross_entropy_mask():
    """labels = where(attention_mask == 1, labels, -100), as the LLaMA cross-entropy block writes it."""
    p = Program("ce_mask")
    m = p.add_input("attention_mask", (4, 256), "int64")
    lab = p.add_input("labels", (4, 256), "int64")
    one = _const(p, "one", 1, "int64")
    ign = _const(p, "ignore", -100, "int64")
    e = p.add_node("eq", [m.id, one.id])
    w = p.add_node("where", [e.outputs[0], lab.id, ign.id])
    p.mark_output(w.outputs[0])
    return p, [e.id, w.id]


def mask_multiply(dtype: str = "int64", shape=(8, 1000)):
    """x * mask with an integer mask: float32, the mask converted exactly."""
    p = Program("mask_mul")
    x = p.add_input("x", shape)
    m = p.add_input("mask", shape, dtype)
    n = p.add_node("mul", [m.id, x.id])
    t = p.add_node("tanh", [n.outputs[0]])
    p.mark_output(t.outputs[0])
    return p, [n.id, t.id]


def masked_mean(dtype: str = "int64", shape=(4, 64, 32)):
    """(x * mask.float()).sum(1) / mask.sum(1): the masked mean pooling of sentence encoders; the count
    is torch's exact int64 sum of the mask. Returns the program and its node groups."""
    p = Program("masked_mean")
    x = p.add_input("x", shape)
    m = p.add_input("mask", shape[:2] + (1,), dtype)
    c = p.add_node("cast", [m.id], {"dtype": "float32"})
    mul = p.add_node("mul", [x.id, c.outputs[0]])
    num = p.add_node("sum", [mul.outputs[0]], {"dim": [1]})
    den = p.add_node("sum", [m.id], {"dim": [1]})
    d = p.add_node("div", [num.outputs[0], den.outputs[0]])
    p.mark_output(d.outputs[0])
    return p, {"numerator": [c.id, mul.id, num.id], "count": [den.id], "div": [d.id]}


def masked_mean_numerator(dtype: str = "int64"):
    p, groups = masked_mean(dtype)
    return p, groups["numerator"]


def mask_count(dtype: str = "int64", shape=(64, 512), dim=1, epilogue=True):
    """mask.sum(dim) (int64 in torch for every integer and bool dtype), then * 1 + 0.5 in float32."""
    p = Program("mask_count")
    m = p.add_input("mask", shape, dtype)
    s = p.add_node("sum", [m.id], {"dim": [dim]})
    ids = [s.id]
    out = s.outputs[0]
    if epilogue:
        e = p.add_node("add_scalar", [out], {"value": 0.5})
        ids.append(e.id)
        out = e.outputs[0]
    p.mark_output(out)
    return p, ids


def loss_epilogue(shape=(64, 1000)):
    """loss = where(labels == -100, 0, logsumexp(logits)) per row: an ignore_index epilogue whose
    comparison reads int64 labels directly."""
    p = Program("loss_epilogue")
    lg = p.add_input("logits", shape)
    lab = p.add_input("labels", shape[:1] + (1,), "int64")
    ign = _const(p, "ignore", -100, "int64")
    zero = _const(p, "zero", 0.0, "float32")
    lse = p.add_node("logsumexp", [lg.id], {"dim": [1], "keepdim": True})
    eq = p.add_node("eq", [lab.id, ign.id])
    w = p.add_node("where", [eq.outputs[0], zero.id, lse.outputs[0]])
    p.mark_output(w.outputs[0])
    return p, [lse.id, eq.id, w.id]


def mask_softmax(dtype: str = "int64", shape=(16, 512)):
    """softmax(x * mask + (1 - mask) * -1e4): BERT's additive attention mask from an integer mask."""
    p = Program("mask_softmax")
    x = p.add_input("x", shape)
    m = p.add_input("mask", shape[-1:] if len(shape) > 1 else shape, dtype)
    r = p.add_node("rsub_scalar", [m.id], {"value": 1})
    big = p.add_node("mul_scalar", [r.outputs[0]], {"value": -10000.0})
    a = p.add_node("add", [x.id, big.outputs[0]])
    s = p.add_node("softmax", [a.outputs[0]], {"dim": -1})
    p.mark_output(s.outputs[0])
    return p, [r.id, big.id, a.id, s.id]


def _mask_softmax_for(dtype):
    return lambda: mask_softmax(dtype)


ROW_CASES = {
    "masked_mean_int64": lambda: masked_mean_numerator("int64"),
    "masked_mean_bool": lambda: masked_mean_numerator("bool"),
    "loss_epilogue": loss_epilogue,
    "mask_softmax_int64": _mask_softmax_for("int64"),
    "mask_softmax_int32": _mask_softmax_for("int32"),
    "mask_softmax_uint8": _mask_softmax_for("uint8"),
    "mask_softmax_int8": _mask_softmax_for("int8"),
    "mask_softmax_long_rows": lambda: mask_softmax("int64", (8, 20000)),
    "mask_multiply_softmax": lambda: _mul_softmax(),
    **{f"mask_count_{dt}": (lambda dt=dt: mask_count(dt)) for dt in DTYPES},
    "mask_count_long_rows": lambda: mask_count("int64", (4, 70000)),
    "mask_count_columns": lambda: mask_count("uint8", (300, 64), dim=0),
    "mask_count_int64_only": lambda: mask_count("bool", (128, 77), epilogue=False),
}


def _mul_softmax():
    p = Program("mul_softmax")
    x = p.add_input("x", (32, 1000))
    m = p.add_input("mask", (32, 1000), "int64")
    n = p.add_node("mul", [x.id, m.id])
    s = p.add_node("softmax", [n.outputs[0]], {"dim": -1})
    p.mark_output(s.outputs[0])
    return p, [n.id, s.id]


def _planned_masked_mean():
    """the cast and the mask multiply fuse (the planner puts the sum with the division); the int64
    count is its own generated kernel"""
    p, groups = masked_mean("int64")
    return p, [groups["numerator"][:2], groups["count"]]


def _planned(build):
    def make():
        p, ids = build()
        return p, [ids]
    return make


# each: (program, groups of node ids; each group must lie in one region that runs as a generated kernel)
PLANNED = {"masked_mean": _planned_masked_mean, "where_ignore_index_epilogue": _planned(loss_epilogue),
           "int64_mask_multiply": _planned(mask_multiply), "cross_entropy_mask": _planned(cross_entropy_mask),
           # the planner fuses the mask arithmetic over [512] apart from the softmax over [16, 512]
           "int64_mask_softmax": _planned(lambda: (lambda p, ids: (p, ids[:3]))(*mask_softmax()))}
