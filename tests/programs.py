"""Small programs the codegen tests build, shared by the CPU (compile) and GPU (verify) tests, and
the GPU tests' check that a region's kernel was kept."""
from agent_core.ir import Program


def fused(p, ids, name, **kw):
    """build_region on the GPU, asserting the generated kernel was kept: compiled, launched and
    verified on 5 random draws."""
    from agent_core.runtime import build_region
    r = build_region(p, ids, name=name, **kw)
    assert r.fused, r.fallback_reason
    assert r.verify.ok and r.verify.draws == 5, r.verify
    return r


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


def arg_program(op, shape, dim, keepdim=False):
    p = Program(op)
    x = p.add_input("x", shape)
    n = p.add_node(op, [x.id], {"dim": dim, "keepdim": keepdim})
    p.mark_output(n.outputs[0])
    return p, n.id


def scan_program(op, shape, dim):
    p = Program(op)
    x = p.add_input("x", shape)
    n = p.add_node(op, [x.id], {"dim": dim})
    p.mark_output(n.outputs[0])
    return p, n.id


def nll_program(shape, reduction, weight=False, ignore_index=-100):
    """nll_loss of log-probabilities `shape` ([C], [N, C] or [N, C, d...]); the random targets are
    drawn in [0, C) (an ignore_index inside that range is drawn too, so it is exercised)."""
    classes = shape[0] if len(shape) == 1 else shape[1]
    tshape = () if len(shape) == 1 else (shape[0], *shape[2:])
    p = Program("nll")
    x = p.add_input("logp", shape)
    t = p.add_input("target", tshape, "int64", init={"kind": "randint", "low": 0, "high": classes})
    ins = [x.id, t.id]
    if weight:
        ins.append(p.add_parameter("class_weight", shape=[classes]).id)
    n = p.add_node("nll_loss", ins, {"reduction": reduction, "ignore_index": ignore_index})
    p.mark_output(n.outputs[0])
    return p, n.id
