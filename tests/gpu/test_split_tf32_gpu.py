"""On the GPU: split TF32 (runtime.split_tf32) runs matmuls and convolutions on tensor cores inside the
1e-4 tolerance, where one TF32 call is far outside it; the agent chooses it per node and the program
verifies and replays as one CUDA graph with it. Weights are drawn as torch's layers initialise them
(uniform in +-1/sqrt(fan_in)), as in KernelBench.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_split_tf32_gpu.py
"""
import io

import math

import numpy as np
import pytest
import torch

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.ir import Program
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import split_tf32 as st

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _init(shape, fan_in):
    bound = 1 / math.sqrt(fan_in)
    return np.random.default_rng(0).uniform(-bound, bound, size=shape).astype(np.float32)


def _node(op, shapes, attrs=None):
    p = Program(op)
    x = p.add_input("x", shapes[0])
    w = shapes[1]   # fan_in as torch computes it: the product of the weight's dims after the first
    fan_in = w[-2] if op in ("matmul", "bmm") else math.prod(w[1:])
    rest = [p.add_parameter(f"p{i}", _init(s, fan_in)).id for i, s in enumerate(shapes[1:])]
    n = p.add_node(op, [x.id] + rest, attrs or {})
    p.mark_output(n.outputs[0])
    return p, n


def _errors(p, n):
    """Worst |result - float64| of fp32, split TF32 and one TF32 call, in units of the 1e-4 tolerance."""
    env = dict(parameter_tensors(p, "cuda"))
    env[p.inputs[0]] = torch.randn(p.values[p.inputs[0]].shape, device="cuda")
    exact = n.opdef.reference([env[v].double() if v else None for v in n.inputs], n.attrs)
    out = n.outputs[0]

    def units(t):
        return float(((t.double() - exact).abs() / (1e-4 + 1e-4 * exact.abs())).max())
    fp32, split, one, cat = dict(env), dict(env), dict(env), dict(env)
    with torch.no_grad():
        run_node(p, n.id, fp32)
        st.run_split_tf32(p, n.id, split)
        with st.tf32_tensor_cores():
            run_node(p, n.id, one)
        if st.can_concatenate(p, n.id):
            st.run_split_tf32_cat(p, n.id, cat)
    return units(fp32[out]), units(split[out]), units(one[out]), (units(cat[out]) if out in cat else None)


@pytest.mark.parametrize("op,shapes,attrs", [
    ("linear", [(512, 8192), (4096, 8192), (4096,)], {}),
    ("bmm", [(8, 256, 2048), (8, 2048, 512)], {}),
    ("conv_transpose3d", [(8, 32, 8, 16, 16), (32, 64, 3, 3, 3), (64,)], {"stride": [2, 2, 2], "padding": [1, 1, 1]}),
    ("conv2d", [(16, 64, 32, 32), (128, 64, 3, 3), (128,)], {}),
    ("conv2d", [(10, 240, 56, 56), (240, 80, 1, 1), (240,)], {"groups": 3}),                  # ShuffleNet's
    ("conv_transpose2d", [(8, 64, 16, 16), (64, 16, 3, 3), (64,)], {"groups": 4, "stride": [2, 2]}),
], ids=["linear", "bmm", "conv_transpose3d", "conv2d", "conv2d_grouped", "conv_transpose2d_grouped"])
def test_split_tf32_is_as_accurate_as_fp32_where_one_tf32_call_is_not(op, shapes, attrs):
    fp32, split, one, cat = _errors(*_node(op, shapes, attrs))
    # inside the tolerance, though less accurate than fp32 (its error grows with the reduction length:
    # tensor cores truncate as they accumulate), which is why every use is verified
    print(f"{op}: worst error in tolerance units: fp32 {fp32:.3g}, split {split:.3g}, concatenated {cat:.3g}, "
          f"one TF32 call {one:.3g}")
    assert split < 0.6, (fp32, split, one)
    assert cat < 0.6, (fp32, split, one, cat)     # and as one call over the concatenated parts
    if op in ("linear", "bmm"):    # cuBLAS always takes tensor cores under TF32 (cuDNN sometimes does not)
        assert one > 10 * split, (fp32, split, one)      # the split is what makes them usable
        # cuBLAS reduces K in order: with the small products first the one call is about as accurate as
        # the three (hi * hi first, the linear's was 3x theirs: 0.81 units against 0.27, H100)
        assert cat <= 1.5 * split + 0.02, (fp32, split, one, cat)


def test_the_agent_chooses_split_tf32_for_a_large_gemm_and_the_program_verifies_in_one_graph():
    p = Program("gemm_relu")
    x = p.add_input("x", [1024, 4096])
    w = p.add_parameter("w", _init([4096, 4096], 4096))
    b = p.add_parameter("b", _init([4096], 4096))
    h = p.add_node("linear", [x.id, w.id, b.id])
    r = p.add_node("relu", [h.outputs[0]])
    p.mark_output(r.outputs[0])
    p.metadata["memory_budget_bytes"] = 1 << 34      # room for the split weight and activation parts
    buf = io.StringIO()
    res = optimize(p, emit=EventEmitter(buf), tune=False, baselines=False, draws=5, trials=10)
    events = list(read_events(buf.getvalue().splitlines()))
    prec = [e for e in events if e["event"] == "precision"]
    assert len(prec) == 1 and prec[0]["chosen"] in ("3xtf32", "3xtf32-cat"), prec    # as three calls or one
    assert min(prec[0]["tf32x3_ms"], prec[0]["tf32x3_cat_ms"]) < prec[0]["fp32_ms"]
    print(f"1024x4096x4096 linear: fp32 {prec[0]['fp32_ms']:.3f} ms, split TF32 as three calls "
          f"{prec[0]['tf32x3_ms']:.3f} ms, concatenated {prec[0]['tf32x3_cat_ms']:.3f} ms")
    e2e = res.profile["end_to_end"]
    assert e2e["correct"] and e2e["verify"]["draws"] == 5 and e2e["cuda_graph"], e2e
    assert res.program.metadata["library_precision"] == {h.id: prec[0]["chosen"]}
    # TF32 is off again for everything else (the reference and the baselines)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


def test_fp32_only_keeps_every_call_in_fp32():
    p, n = _node("linear", [(256, 1024), (1024, 1024)])
    res = optimize(p, emit=EventEmitter(io.StringIO()), tune=False, baselines=False, trials=5, split_tf32=False)
    assert res.profile["end_to_end"]["correct"]
    assert not res.program.metadata.get("library_precision")


def test_a_timed_cudnn_algorithm_agrees_with_fp32_and_replays_in_a_graph():
    from agent_core.profile.timing import time_in_graph
    p, n = _node("conv_transpose3d", [(16, 3, 16, 32, 32), (3, 16, 3, 3, 3), (16,)],
                 {"stride": [2, 2, 2], "padding": [1, 1, 1], "output_padding": [1, 1, 1]})
    env = dict(parameter_tensors(p, "cuda"))
    env[p.inputs[0]] = torch.randn(p.values[p.inputs[0]].shape, device="cuda")
    plain, timed = dict(env), dict(env)
    with torch.no_grad():
        run_node(p, n.id, plain)
        st.run_timed_fp32(p, n.id, timed)
        t, how = time_in_graph(lambda: st.run_timed_fp32(p, n.id, dict(env)), trials=5)
    out = n.outputs[0]
    assert torch.allclose(timed[out], plain[out], rtol=1e-5, atol=1e-5)
    assert how == "graph" and t.median_ms > 0
    assert not torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic


def test_splitting_a_weight_allocates_its_two_parts_and_nothing_more():
    from agent_core.profile.peak_memory import peak_above
    w = torch.randn(1024, 1024, device="cuda")
    size = w.untyped_storage().nbytes()
    st.split_tf32(w[:4])     # the kernel's once-per-process check of its bits is not this call's
    assert peak_above(lambda: st.split_tf32(w)) == 2 * size
    assert peak_above(lambda: st.weight_cat(w, 1)) == 3 * size
    hi, lo = st.split_tf32(w)
    assert torch.equal(hi + lo, w) or (hi.double() + lo.double() - w.double()).abs().max() <= 2 ** -21 * w.abs().max()
    assert torch.equal(st.weight_cat(w, 1), torch.cat([hi, lo, hi], dim=1))


SPLIT_LAYOUTS = [   # (shape, memory format, concatenated along dim with lo_at, or None for a plain split)
    ((4, 1000), None, None), ((7, 13), None, None),                           # float4 and scalar loops
    ((2, 8, 5, 4), torch.channels_last, None),                                # a dense permuted layout
    ((3, 6, 7, 5), None, (1, st.A_LO)), ((6, 4, 3, 3), None, (0, st.B_LO)),   # contiguous rows
    ((2, 8, 9, 7), torch.channels_last, (1, st.A_LO)), ((2, 5, 3, 3, 2), torch.channels_last_3d, (1, st.B_LO)),
    ((3, 6, 7, 5), None, (1, 2)),                                             # lo last
]


def _parts(x, fmt, cat, dst=None):
    """The split parts of x as a tuple (into dst when given: the concatenated form)."""
    if cat is None:
        return st.split_tf32(x)
    dim, lo_at = cat
    wide = list(x.shape)
    wide[dim] *= 3
    dst = torch.empty(wide, device=x.device, memory_format=fmt or torch.contiguous_format) if dst is None else dst
    st.split_cat_into(x, dst, dim, lo_at)
    return (dst,)


def _same_bits(got, want):
    for g, w in zip(got, want, strict=True):
        g = g.cpu()
        assert g.stride() == w.stride() and torch.equal(torch.isnan(g), torch.isnan(w))
        assert torch.equal(g.view(torch.int32)[~torch.isnan(g)], w.view(torch.int32)[~torch.isnan(w)])


@pytest.mark.parametrize("shape,fmt,cat", SPLIT_LAYOUTS, ids=[f"{s}-{f}-{c}" for s, f, c in SPLIT_LAYOUTS])
def test_the_split_kernel_gives_the_torch_ops_bits_in_one_launch_and_replays_in_a_graph(shape, fmt, cat):
    from agent_core.profile.launched import launched_kernels
    from agent_core.runtime import split_kernel as sk
    x = (torch.randn(shape) * torch.exp(torch.empty(shape).uniform_(-40, 40))).contiguous(
        memory_format=fmt or torch.contiguous_format)
    x.as_strided((6,), (1,)).copy_(sk.special_values().view(torch.float32))   # the first 6 in memory
    xc = x.cuda()
    got = _parts(xc, fmt, cat)
    _same_bits(got, _parts(x, fmt, cat))          # CPU tensors: the torch ops
    if cat is None:
        call = lambda: st.split_tf32(xc)
    else:
        dst = got[0]
        call = lambda: _parts(xc, fmt, cat, dst)
    assert launched_kernels(call) == {"kernels": 1}
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        captured = call()
    xc.copy_(x * 2)
    graph.replay()
    torch.cuda.synchronize()
    _same_bits(captured, _parts(x * 2, fmt, cat))


def test_the_split_kernel_is_used_only_after_it_matched_the_torch_ops(monkeypatch):
    from agent_core.runtime import split_kernel as sk
    monkeypatch.setattr(sk, "_checked", {})
    assert sk.ready(st._split_ops)

    def wrong(t, hi, lo):          # a reference one bit off: the kernel must not be trusted
        st._split_ops(t, hi, lo)
        lo.view(torch.int32).add_(1)
    monkeypatch.setattr(sk, "_checked", {})
    with pytest.warns(RuntimeWarning, match="differ from the torch ops"):
        assert not sk.ready(wrong)
    assert not sk.ready(st._split_ops)      # decided once per process


@pytest.mark.parametrize("shape,groups", [((2, 40, 14, 14), 1), ((3, 3, 17, 9), 1), ((2, 33, 3, 4, 5), 1),
                                          ((2, 240, 14, 14), 3)])
def test_a_contiguous_input_splits_into_channels_last_parts_in_one_launch(shape, groups):
    from agent_core.profile.launched import launched_kernels
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    wide = [shape[0], 3 * shape[1], *shape[2:]]
    x = torch.randn(shape) * 1e3
    want = torch.empty(wide, memory_format=fmt)
    st.split_cat_into(x, want, 1, 1, groups)                 # CPU tensors: the torch ops
    xc, dst = x.cuda(), torch.empty(wide, device="cuda", memory_format=fmt)
    st.split_cat_into(xc, dst, 1, 1, groups)
    _same_bits((dst,), (want,))
    assert launched_kernels(lambda: st.split_cat_into(xc, dst, 1, 1, groups)) == {"kernels": 1}


@pytest.mark.parametrize("shape,dim,lo_at", [((8, 64, 48), 2, 1), ((8, 48, 64), 1, 2)],
                         ids=["q_rows", "k_transposed"])
def test_a_gemm_operands_concatenated_parts_take_one_launch(shape, dim, lo_at):
    """A's parts along its last dim, and a transposed B's (k.transpose(-2, -1)) along its contiguous
    one, each one launch of the split kernel with the torch ops' bits."""
    from agent_core.profile.launched import launched_kernels
    x = torch.randn(shape) * 1e3
    if dim == 1:                                       # a transposed view, as attention's k^T comes
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    want = st.cat_parts(x, dim, lo_at)                # CPU tensors: the torch ops
    xc = x.cuda() if dim == 2 else x.transpose(1, 2).cuda().transpose(1, 2)
    got = st.cat_parts(xc, dim, lo_at)
    _same_bits((got,), (want,))
    assert launched_kernels(lambda: st.cat_parts(xc, dim, lo_at)) == {"kernels": 1}


def test_a_transposed_matrix_splits_in_one_launch():
    from agent_core.profile.launched import launched_kernels
    x = torch.randn(4, 40, 24).transpose(1, 2) * 1e3
    want = st.split_tf32(x)                              # CPU tensors: the torch ops
    xc = x.transpose(1, 2).cuda().transpose(1, 2)
    _same_bits(st.split_tf32(xc), want)
    assert launched_kernels(lambda: st.split_tf32(xc)) == {"kernels": 1}


def test_a_contiguous_input_splits_into_channels_last_hi_and_lo_in_one_launch():
    from agent_core.profile.launched import launched_kernels
    x = torch.randn(2, 40, 14, 14) * 1e3
    want = st.split_tf32(x, channels_last=True)      # CPU tensors: the torch ops, into strided parts
    xc = x.cuda()
    got = st.split_tf32(xc, channels_last=True)
    assert all(g.is_contiguous(memory_format=torch.channels_last) for g in got)
    _same_bits(got, want)
    assert launched_kernels(lambda: st.split_tf32(xc, channels_last=True)) == {"kernels": 1}


@pytest.mark.parametrize("shape,weight,fmt", [((32, 512, 400), (1024, 512, 1), None),                 # Conformer's
                                              ((10, 256, 56, 56), (64, 256, 1, 1), None),              # ResNet's
                                              ((10, 256, 56, 56), (64, 256, 1, 1), torch.channels_last)],
                         ids=["conv1d", "conv2d", "conv2d_channels_last"])
def test_a_1x1_convolution_runs_as_one_gemm_that_copies_no_weight_per_image(shape, weight, fmt):
    """The concatenated form of a 1x1 convolution is one cuBLAS GEMM: the weight shared by the batch
    (stride 0), so one call allocates the concatenated input and the output and nothing else; at
    about as accurate as the three calls against float64. Prints its time beside cuDNN's concatenated call."""
    from agent_core.profile.peak_memory import peak_above
    op = f"conv{len(shape) - 2}d"
    p, n = _node(op, [shape, weight, (weight[0],)])
    env = dict(parameter_tensors(p, "cuda"))
    x = torch.randn(shape, device="cuda")
    env[p.inputs[0]] = x.contiguous(memory_format=fmt) if fmt else x
    out = n.outputs[0]
    gemm = dict(env)
    st.run_split_tf32_cat(p, n.id, gemm, True, fmt is not None)       # the weight's parts cached first
    assert st.is_pointwise_conv(n, env[p.inputs[0]], env[n.inputs[1]])
    out_bytes = math.prod(p.values[out].shape) * 4
    assert peak_above(lambda: st.run_split_tf32_cat(p, n.id, dict(env), True, fmt is not None)) <= \
        3 * x.numel() * 4 + out_bytes + (1 << 20)    # + cuBLAS's own workspace at most
    exact = n.opdef.reference([env[v].double() for v in n.inputs], n.attrs)
    fp32 = dict(env)
    run_node(p, n.id, fp32)
    err = lambda t: float((t.double() - exact).abs().max())
    three = dict(env)
    st.run_split_tf32(p, n.id, three, True, fmt is not None)
    print(f"{op} 1x1 {shape}: worst error against float64: one GEMM {err(gemm[out]):.3g}, three calls "
          f"{err(three[out]):.3g}, fp32 {err(fp32[out]):.3g}")
    # about as accurate as the three calls it replaces (small products first along K; with hi * hi
    # first it erred 3-6x fp32's: 1.9e-5 against 3.3e-6 for Conformer's, H100)
    assert err(gemm[out]) <= 1.5 * err(three[out]) + 1e-7
    with st.tf32_tensor_cores():      # cuDNN's call over the same concatenated parts, for the record
        a_cat = torch.empty((shape[0], 3 * shape[1], *shape[2:]), device="cuda",
                            memory_format=fmt or torch.contiguous_format)
        st.split_cat_into(env[p.inputs[0]], a_cat, 1, st.A_LO)
        w_cat = st.weight_cat(env[n.inputs[1]], 1, fmt)
        ms = {}
        for name, run in (("gemm", lambda: st.run_split_tf32_cat(p, n.id, dict(env), True, fmt is not None)),
                          ("cudnn", lambda: n.opdef.reference([a_cat, w_cat, env[n.inputs[2]]], n.attrs))):
            for _ in range(3):
                run()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                run()
            end.record()
            torch.cuda.synchronize()
            ms[name] = start.elapsed_time(end) / 20
    print(f"1x1 {op} {shape} -> {weight[0]} {fmt}: one GEMM {ms['gemm']:.3f} ms (with the input's split), "
          f"cuDNN {ms['cudnn']:.3f} ms (parts made beforehand)")
