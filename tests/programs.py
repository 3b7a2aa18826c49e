"""Small programs the codegen tests build, shared by the CPU (compile) and GPU (verify) tests."""
from agent_core.ir import Program


def stitched(op, attrs, shape, prologue=True, epilogue="tanh"):
    """x -> [mul by a per-column scale] -> op -> [epilogue]: the program and the region's node ids.
    layer_norm and rms_norm normalize the last dim, with a weight (and layer_norm a bias)."""
    p = Program(op)
    x = p.add_input("x", shape)
    ids, cur = [], x.id
    if prologue:
        s = p.add_input("scale", shape[-1:])
        n = p.add_node("mul", [cur, s.id])
        ids.append(n.id)
        cur = n.outputs[0]
    attrs, ins = dict(attrs), [cur]
    if op in ("layer_norm", "rms_norm"):
        attrs["normalized_shape"] = [shape[-1]]
        ins.append(p.add_parameter("weight", shape=shape[-1:]).id)
        if op == "layer_norm":
            ins.append(p.add_parameter("bias", shape=shape[-1:]).id)
    n = p.add_node(op, ins, attrs)
    ids.append(n.id)
    cur = n.outputs[0]
    if epilogue:
        e = p.add_node(epilogue, [cur])
        ids.append(e.id)
        cur = e.outputs[0]
    p.mark_output(cur)
    return p, ids


def pooled(op, attrs, shape):
    """relu -> pooling op -> tanh: the program and the region's node ids."""
    p = Program("pool")
    x = p.add_input("x", shape)
    r = p.add_node("relu", [x.id])
    n = p.add_node(op, [r.outputs[0]], attrs)
    t = p.add_node("tanh", [n.outputs[0]])
    p.mark_output(t.outputs[0])
    return p, [r.id, n.id, t.id]
