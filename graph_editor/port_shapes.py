"""The shape an op expects on one of its unconnected input ports, where what is already connected
(and the node's attributes) tells it: what "New parameter" in the inspector creates. Qt-free.

A guess is only returned after the op's own inference accepts it, so a parameter made from it always
connects; None means "nothing to go on" and the user types the shape.
"""
from __future__ import annotations

from agent_core.ir import Program
from agent_core.ops import TensorSpec


def expected_shape(program: Program, node_id: str, port: int) -> tuple[int, ...] | None:
    node = program.nodes[node_id]
    shapes = [program.values[v].shape if v in program.values else None for v in node.inputs]
    shapes += [None] * (max(port + 1, len(node.opdef.inputs)) - len(shapes))
    guess = _guess(node.op, node.opdef.port_name(port), shapes, node.attrs)
    if guess is None or not _accepted(program, node_id, port, guess):
        return None
    return tuple(guess)


def _guess(op: str, port: str, shapes: list, attrs: dict):
    x = shapes[0]
    if x is None:
        return None
    if op == "linear" and x:
        # weight [out, in]; out is free (linear has no attribute for it): the bias says it, else in
        if port == "weight":
            return [shapes[2][0] if len(shapes) > 2 and shapes[2] else x[-1], x[-1]]
        if port == "bias":
            return [shapes[1][0] if shapes[1] else x[-1]]
    if op.startswith("conv") and len(x) >= 3:
        spatial, groups = len(x) - 2, int(attrs.get("groups", 1) or 1)
        transposed = op.startswith("conv_transpose")
        if port == "weight":   # out channels default to in channels, 3-wide kernels
            return [x[1], x[1] // groups] + [3] * spatial
        if port == "bias":
            w = shapes[1]
            if w is None:
                return [x[1]]
            return [w[1] * groups if transposed else w[0]]
    if op in ("layer_norm", "rms_norm") and port in ("weight", "bias"):
        return list(attrs.get("normalized_shape") or [x[-1]])
    if op in ("batch_norm", "instance_norm", "group_norm") and len(x) >= 2:
        return [x[1]]
    # pointwise and most others: the shape of the first input
    return list(x)


def _accepted(program: Program, node_id: str, port: int, shape) -> bool:
    """Does the op's inference accept a float32 tensor of this shape on `port` (with the rest as is)?"""
    node = program.nodes[node_id]
    specs = [program.values[v].spec if v in program.values else None for v in node.inputs]
    specs += [None] * (port + 1 - len(specs))
    specs[port] = TensorSpec(tuple(shape), "float32")
    lo, _ = node.opdef.arity()
    if any(s is None for s in specs[:lo]):
        return True   # another required port is still open: nothing can refuse it yet
    try:
        node.opdef.infer(specs, node.attrs)
    except Exception:  # op-specific checks raise many kinds of errors; a refusal is all we need
        return False
    return True
