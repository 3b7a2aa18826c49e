"""torch's own plan for an einsum: the aten ops torch.einsum issues for operands of given shapes,
recorded on meta tensors (nothing is computed or allocated).

Used twice: ops/matmul.py counts an einsum's FLOPs as the bmm's, products and sums torch runs (not 2 x
the product of every index's size, which for Mamba2's 4-operand diagonal block is 275 GFLOP where
torch does 21), and rewrites/einsum.py writes an einsum out as exactly these steps.
"""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = frozenset({"unsqueeze", "squeeze", "view", "_unsafe_view", "reshape", "_reshape_alias", "flatten"})
SAME = frozenset({"clone", "contiguous", "alias", "detach", "lift_fresh"})   # no change of value


class Unsupported(Exception):
    pass


class _Recorder(TorchDispatchMode):
    """Records (op, input tensors, attrs, output) for the aten ops torch.einsum issues."""

    def __init__(self):
        super().__init__()
        self.steps: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        ins = [a for a in args if isinstance(a, torch.Tensor)]
        if not isinstance(out, torch.Tensor):
            raise Unsupported(f"aten.{name} returns {type(out).__name__}")
        if name in VIEWS:
            if out.numel() != ins[0].numel():
                raise Unsupported(f"aten.{name} changes the element count")
            self.steps.append(("reshape", ins[:1], {"shape": list(out.shape)}, out))
        elif name in SAME:
            self.steps.append(("same", ins[:1], {}, out))
        elif name == "permute":
            self.steps.append(("permute", ins[:1], {"dims": [int(d) for d in args[1]]}, out))
        elif name == "bmm" and len(ins) == 2:
            self.steps.append(("bmm", ins, {}, out))
        elif name == "mul" and len(ins) == 2 and not kwargs:
            self.steps.append(("mul", ins, {}, out))
        elif name == "sum" and len(ins) == 1 and len(args) >= 2:
            dims = [int(d) for d in args[1]]
            keep = bool(args[2]) if len(args) > 2 else bool(kwargs.get("keepdim", False))
            self.steps.append(("sum", ins, {"dim": dims, "keepdim": keep}, out))
        else:
            raise Unsupported(f"torch.einsum issues aten.{name}")
        return out


def torch_steps(equation: str, shapes: list[tuple]) -> tuple[list[tuple], list, torch.Tensor]:
    """The aten ops torch.einsum runs for operands of these shapes (float32, contiguous): the steps,
    the meta operands they start from and the result; Unsupported when one is not written out here."""
    operands = [torch.empty(s, dtype=torch.float32, device="meta") for s in shapes]
    rec = _Recorder()
    try:
        with rec:
            out = torch.einsum(equation, *operands)
    except RuntimeError as exc:
        raise Unsupported(str(exc).splitlines()[0]) from None
    return rec.steps, operands, out


def plan_flops(equation: str, shapes: list[tuple]) -> int | None:
    """FLOPs of torch's plan for the einsum: 2 B M N K per bmm, one per element of a mul or of a
    sum's input; None when it cannot be recorded."""
    try:
        steps, _, _ = torch_steps(equation, shapes)
    except Unsupported:
        return None
    total = 0
    for op, ins, _, out in steps:
        if op == "bmm":
            b, m, k = ins[0].shape
            total += 2 * b * m * k * ins[1].shape[-1]
        elif op == "mul":
            total += out.numel()
        elif op == "sum":
            total += ins[0].numel()
    return total


def einsum_flops(equation: str, shapes: list[tuple]) -> int:
    """What ops/matmul.py counts for an einsum: torch's plan (plan_flops), else 2 x the product of
    every index's size."""
    got = plan_flops(equation, shapes)
    if got is not None:
        return got
    return _naive(equation, shapes)


def _naive(equation: str, shapes) -> int:
    eq = equation.replace(" ", "")
    lhs = eq.split("->")[0].split(",")
    sizes = {}
    for term, shape in zip(lhs, shapes):
        letters = term.replace("...", "")
        tail = shape[len(shape) - len(letters):] if letters else ()
        for ch, k in zip(letters, tail):
            sizes[ch] = max(sizes.get(ch, 1), k)
        if "..." in term:
            ell = shape[: len(shape) - len(letters)]
            sizes["..."] = max(sizes.get("...", 1), math.prod(ell))
    return 2 * math.prod(sizes.values())
