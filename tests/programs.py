"""Small programs the codegen tests build, shared by the CPU (compile) and GPU (verify) tests, and
the GPU tests' check that a region's kernel was kept."""
from agent_core.ir import Program

# Sixteen softmax regions of distinct widths (so no two share a cached kernel), as a program file:
# optimizing it takes seconds of compiling, so a Ctrl+C sent once it starts lands while it runs.
SIXTEEN_SOFTMAXES = '''import torch


class Model(torch.nn.Module):
    def forward(self, *xs):
        return tuple(torch.softmax(x, dim=1) for x in xs)


def get_inputs():
    return [torch.randn(32, 64 + 8 * i) for i in range(16)]


def get_init_inputs():
    return []
'''


def interrupt_at(proc, marker: str) -> tuple[str, str]:
    """Ctrl+C (SIGINT) to a CLI subprocess once its output shows `marker`: (output until then, the
    rest). The process is killed if it outlives that."""
    import signal
    try:
        seen = ""
        while marker not in seen:
            line = proc.stdout.readline()
            assert line, seen
            seen += line
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return seen, rest


def cli(*args, timeout=300):
    """`python -m agent_core.cli ARGS` as a shell runs it: the completed process, output captured."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def add_chain(p, cur: str, ops) -> tuple[list[str], str]:
    """Append `ops` ((op, attrs) pairs) to program p one after another from value `cur`, the last one's
    output marked as p's output: (the node ids, that output)."""
    ids = []
    for op, attrs in ops:
        n = p.add_node(op, [cur], attrs)
        ids.append(n.id)
        cur = n.outputs[0]
    p.mark_output(cur)
    return ids, cur


def emulated(p, ks, inputs, guard=256):
    """The reference run of p on `inputs` (its inputs in order), and ks run in the CPU emulator on the
    reference's values of its region inputs: (the kernel's first output, the reference's)."""
    import numpy as np
    import torch

    from agent_core.reference import run_reference
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    env = run_reference(p, list(inputs), keep=True)
    out = p.values[ks.outputs[0]]
    dtype = env[ks.outputs[0]].numpy().dtype     # an argmax's int64, a mask's bool: read as written
    bufs = [guarded(env[v].contiguous().numpy(), guard) for v in ks.inputs]
    bufs.append(guarded(np.zeros(out.shape, dtype), guard))
    res = CpuExecutor().run(ks, [bufs], guard=guard)
    got = torch.from_numpy(payload(res[0][-1], guard, dtype, tuple(out.shape)).copy())
    return got, env[ks.outputs[0]]


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


def column_reduction(op, attrs, shape, keep_relu=False):
    """relu -> op (a reduction or normalization over leading or middle dims) -> x2: the program and the
    region's node ids; with keep_relu the relu's value leaves the region too."""
    p = Program("col")
    x = p.add_input("x", shape)
    r = p.add_node("relu", [x.id])
    n = p.add_node(op, [r.outputs[0]], attrs)
    e = p.add_node("mul_scalar", [n.outputs[0]], {"value": 2.0})
    p.mark_output(e.outputs[0])
    if keep_relu:
        p.mark_output(r.outputs[0])
    return p, [r.id, n.id, e.id]


def residual(shape, op, attrs):
    """The residual stream: a = x + b feeds `op` and is returned beside it: (program, [add, op])."""
    p = Program("residual")
    x = p.add_input("x", shape)
    b = p.add_input("b", shape[-1:])
    a = p.add_node("add", [x.id, b.id])
    n = p.add_node(op, [a.outputs[0]], attrs)
    p.mark_output(n.outputs[0])
    p.mark_output(a.outputs[0])
    return p, [a.id, n.id]


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


# (input shape, dim, start, end, step) of strided slices: last and middle dims, steps 2 and 3, odd sizes
SLICE_CASES = [((3, 10, 7), 1, 1, 9, 3), ((4, 9), 1, 0, None, 2), ((5, 13), -1, 2, None, 3), ((7, 11, 5), 1, 0, 11, 2),
               ((2, 3, 17), 2, 1, 16, 2), ((9,), 0, 0, None, 2), ((15, 4), 0, 3, 14, 3), ((2, 5, 7, 3), 2, 1, None, 3),
               ((4, 240, 16), 1, 100, 200, 2)]
SLICE_BOUNDS_CASES = [((6, 10), 1, -7, -1, 2), ((6, 10), 1, 3, 99, 4)]   # negative and out-of-range bounds


def sliced(shape, dim, start, end, step, around=False):
    """x[start:end:step] along dim; around: with a prologue (+ a broadcast input, gelu) before the
    slice and an epilogue (* a broadcast input, relu) after it. The program and the region's node ids."""
    p = Program("slice")
    v = p.add_input("x", shape).id
    ids = []
    if around:
        b0 = p.add_input("b0", shape[-1:])
        a = p.add_node("add", [v, b0.id])
        g = p.add_node("gelu", [a.outputs[0]])
        ids += [a.id, g.id]
        v = g.outputs[0]
    t = p.add_node("slice", [v], {"dim": dim, "start": start, "end": end, "step": step})
    ids.append(t.id)
    v = t.outputs[0]
    if around:
        b = p.add_input("b", p.values[v].shape[-1:])
        e = p.add_node("mul", [v, b.id])
        r = p.add_node("relu", [e.outputs[0]])
        ids += [e.id, r.id]
        v = r.outputs[0]
    p.mark_output(v)
    return p, ids


# (op, input shape, output_size): sizes that divide the input, that do not, and outputs larger than it
ADAPTIVE_CASES = [
    ("adaptive_avg_pool1d", (2, 3, 257), [10]),
    ("adaptive_max_pool1d", (2, 3, 257), [10]),
    ("adaptive_avg_pool1d", (2, 3, 7), [3]),
    ("adaptive_max_pool1d", (2, 3, 12), [4]),
    ("adaptive_avg_pool1d", (2, 3, 5), [8]),
    ("adaptive_max_pool1d", (3, 5), [8]),
    ("adaptive_avg_pool2d", (2, 3, 30, 30), [4, 4]),
    ("adaptive_max_pool2d", (2, 3, 30, 30), [4, 4]),
    ("adaptive_avg_pool2d", (2, 3, 7, 9), [3, 5]),
    ("adaptive_max_pool2d", (2, 3, 5, 6), [8, 7]),
    ("adaptive_avg_pool2d", (2, 3, 7, 9), [1, 3]),
    ("adaptive_max_pool2d", (2, 3, 7, 9), [1, 1]),
    ("adaptive_avg_pool3d", (1, 2, 5, 6, 7), [2, 3, 4]),
    ("adaptive_max_pool3d", (1, 2, 5, 6, 7), [2, 3, 4]),
    ("adaptive_avg_pool3d", (1, 2, 3, 4, 5), [5, 6, 7]),
    ("adaptive_max_pool3d", (2, 3, 4, 4), [2, 2, 2]),
]


def kl_terms(shape, temperature: float = 2.0):
    """Distillation's KL terms as the lower_loss rewrite writes kl_div out (no final sum):
    softmax(teacher / T) * (log(softmax(teacher / T)) - log_softmax(student / T)), two inputs, one row."""
    p = Program("kl_terms")
    s = p.add_input("student", shape)
    t = p.add_input("teacher", shape)
    a = p.add_node("div_scalar", [s.id], {"value": temperature})
    ls = p.add_node("log_softmax", [a.outputs[0]], {"dim": -1})
    b = p.add_node("div_scalar", [t.id], {"value": temperature})
    sm = p.add_node("softmax", [b.outputs[0]], {"dim": -1})
    c = p.add_node("max_scalar", [sm.outputs[0]], {"value": 1e-30})
    lg = p.add_node("log", [c.outputs[0]])
    d = p.add_node("sub", [lg.outputs[0], ls.outputs[0]])
    k = p.add_node("mul", [sm.outputs[0], d.outputs[0]])
    p.mark_output(k.outputs[0])
    return p, [a.id, ls.id, b.id, sm.id, c.id, lg.id, d.id, k.id]


def ptx_of(ks, tmp_path) -> str:
    """The PTX nvcc makes of a kernel source for sm_90 (the test is skipped without nvcc)."""
    import shutil
    import subprocess

    import pytest
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    cu, ptx = tmp_path / f"{ks.name}.cu", tmp_path / f"{ks.name}.ptx"
    cu.write_text(ks.source)
    subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", "-o", str(ptx), str(cu)], check=True)
    return ptx.read_text()


def row_stats(shape, dim=-1):
    """mean, max and min of one tensor over one dim (an observer's statistics): the program, node ids."""
    p = Program("stats")
    x = p.add_input("x", shape)
    ids = []
    for op in ("mean", "max", "min"):
        n = p.add_node(op, [x.id], {"dim": [dim]})
        p.mark_output(n.outputs[0])
        ids.append(n.id)
    return p, ids


def rms_written_out(shape, name="rms_written_out"):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, as models write RMSNorm by hand."""
    p = Program(name)
    x = p.add_input("x", shape)
    w = p.add_parameter("weight", shape=shape[-1:])
    sq = p.add_node("mul", [x.id, x.id])
    ms = p.add_node("mean", [sq.outputs[0]], {"dim": [-1], "keepdim": True})
    eps = p.add_node("add_scalar", [ms.outputs[0]], {"value": 1e-6})
    r = p.add_node("rsqrt", [eps.outputs[0]])
    y = p.add_node("mul", [x.id, r.outputs[0]])
    z = p.add_node("mul", [w.id, y.outputs[0]])
    p.mark_output(z.outputs[0])
    return p, [sq.id, ms.id, eps.id, r.id, y.id, z.id]


def cancelling_sum(rows: int = 8, n: int = 65536):
    """sum(1e4 x + z) - sum(1e4 x) over rows of n: the big parts cancel, so torch's own fp32 result is
    off by about 0.5 against the float64 value (verify's float64 second opinion)."""
    p = Program("cancel")
    x, z = p.add_input("x", (rows, n)), p.add_input("z", (rows, n))
    big = p.add_node("mul_scalar", [x.id], {"value": 1e4}).outputs[0]
    s1 = p.add_node("sum", [p.add_node("add", [big, z.id]).outputs[0]], {"dim": [1]}).outputs[0]
    s2 = p.add_node("sum", [big], {"dim": [1]}).outputs[0]
    p.mark_output(p.add_node("sub", [s1, s2]).outputs[0])
    return p
