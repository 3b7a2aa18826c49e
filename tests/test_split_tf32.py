"""Split TF32 (runtime.split_tf32) on the CPU: the split's arithmetic, each bilinear op against float64,
the dispatch by program.metadata, and the parameter cache. (On the CPU the TF32 flags change nothing, so
these check the algebra; tests/gpu check the tensor-core path.)"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agent_core.ir import Program
from agent_core.profile.attribution import FP32_TFLOPS, TF32_TFLOPS, effective_tflops
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import split_tf32 as st


def test_split_parts_are_tf32_exact_and_sum_back_to_fp32():
    x = torch.randn(4096) * torch.logspace(-20, 20, 4096)
    hi, lo = st.split_tf32(x)
    low_bits = 0x1FFF
    assert not (hi.view(torch.int32) & low_bits).any() and not (lo.view(torch.int32) & low_bits).any()
    assert (hi - x).abs().le(x.abs() * 2.0 ** -11).all()           # hi is x rounded to 10 mantissa bits
    err = (hi.double() + lo.double() - x.double()).abs()
    assert err.le(x.abs().double() * 2.0 ** -21).all()               # hi + lo is x to about 2^-22


def test_split_keeps_zeros_and_carries_nonfinite_values_in_hi():
    x = torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1.0])
    hi, lo = st.split_tf32(x)
    assert hi[0] == 0 and lo[0] == 0 and lo[1] == 0
    assert hi[2] == float("inf") and lo[2] == 0 and torch.isnan(hi[3]) and lo[3] == 0
    assert hi[4] == 1 and lo[4] == 0


CASES = [
    ("linear", [(33, 70), (19, 70), (19,)], {}),
    ("matmul", [(5, 33, 70), (70, 18)], {}),
    ("matmul", [(1, 9, 20), (3, 20, 7)], {}),          # batches that broadcast (bmm alone would refuse)
    ("matmul", [(6, 40), (40, 11)], {}),
    ("bmm", [(3, 17, 29), (3, 29, 11)], {}),
    ("conv2d", [(2, 5, 13, 11), (7, 5, 3, 3), (7,)], {"stride": [2, 1], "padding": [1, 0], "dilation": [1, 1],
                                                      "groups": 1}),
    ("conv_transpose3d", [(1, 4, 5, 6, 3), (4, 6, 3, 3, 3), (12,)],
     {"stride": [2, 2, 1], "padding": [1, 0, 1], "output_padding": [1, 0, 0], "groups": 2, "dilation": [1, 1, 1]}),
]


def _program(op, shapes, attrs):
    p = Program(op)
    x = p.add_input("x", shapes[0])
    rest = [p.add_parameter(f"p{i}", shape=s).id for i, s in enumerate(shapes[1:])]
    n = p.add_node(op, [x.id] + rest, attrs)
    p.mark_output(n.outputs[0])
    return p, n


@pytest.mark.parametrize("op,shapes,attrs", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_split_form_matches_float64_as_closely_as_fp32(op, shapes, attrs):
    p, n = _program(op, shapes, attrs)
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(shapes[0]) * 3
    exact = n.opdef.reference([env[v].double() if v else None for v in n.inputs], n.attrs)
    fp32, split = dict(env), dict(env)
    run_node(p, n.id, fp32)
    st.run_split_tf32(p, n.id, split)
    out = n.outputs[0]
    scale = exact.abs().max()
    assert (split[out].double() - exact).abs().max() <= 4 * (fp32[out].double() - exact).abs().max() + 1e-6 * scale
    assert torch.allclose(split[out], fp32[out], rtol=1e-5, atol=1e-5 * float(scale))


CONVS = [c for c in CASES if c[0].startswith("conv")]


@pytest.mark.parametrize("op,shapes,attrs", CONVS + [
    ("conv_transpose2d", [(4, 6, 5), (4, 3, 3, 3), (3,)], {"stride": [2, 2], "padding": [1, 0]}),   # unbatched
    ("conv1d", [(3, 4, 17), (5, 4, 3)], {"dilation": [2]}),
    ("conv2d", [(2, 6, 9, 8), (9, 2, 3, 3), (9,)], {"groups": 3, "padding": [1, 1]}),             # ShuffleNet-like
    ("conv1d", [(6, 11), (4, 3, 3)], {"groups": 2}),                                                # unbatched, grouped
] + [c for c in CASES if not c[0].startswith("conv")] + [
    ("linear", [(2, 3, 40), (9, 40)], {}),                                    # batched, no bias
    ("matmul", [(4, 2, 6, 30), (30, 5)], {}),                                 # a weight shared by the batch
], ids=["conv2d", "conv_transpose3d_grouped", "conv_transpose2d_unbatched", "conv1d", "conv2d_grouped",
        "conv1d_unbatched_grouped", "linear", "matmul_3d_2d", "matmul_broadcast", "matmul", "bmm",
        "linear_batched", "matmul_4d_2d"])
def test_the_concatenated_form_is_the_same_sum(op, shapes, attrs):
    p, n = _program(op, shapes, attrs)
    assert st.can_concatenate(p, n.id)
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(shapes[0])
    fp32, cat, split = dict(env), dict(env), dict(env)
    run_node(p, n.id, fp32)
    st.run_split_tf32_cat(p, n.id, cat)
    st.run_split_tf32(p, n.id, split)
    out = n.outputs[0]
    assert cat[out].shape == fp32[out].shape
    assert torch.allclose(cat[out], fp32[out], rtol=1e-5, atol=1e-5)
    assert torch.allclose(cat[out], split[out], rtol=1e-5, atol=1e-5)


POINTWISE = [
    ("conv1d", [(3, 8, 130), (10, 8, 1), (10,)], {}, False),
    ("conv2d", [(2, 6, 12, 11), (9, 6, 1, 1)], {"padding": "same"}, False),
    ("conv2d", [(2, 6, 5, 7), (9, 6, 1, 1), (9,)], {}, True),              # channels-last: one linear
    ("conv3d", [(2, 4, 3, 5, 2), (5, 4, 1, 1, 1), (5,)], {}, True),
]


@pytest.mark.parametrize("op,shapes,attrs,channels_last", POINTWISE,
                         ids=["conv1d", "conv2d_same", "conv2d_channels_last", "conv3d_channels_last"])
def test_a_1x1_convolutions_concatenated_form_is_one_gemm(op, shapes, attrs, channels_last):
    p, n = _program(op, shapes, attrs)
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(shapes[0])
    fp32, cat = dict(env), dict(env)
    run_node(p, n.id, fp32)
    with _AtenOps() as ops:
        st.run_split_tf32_cat(p, n.id, cat, True, channels_last)
    out = n.outputs[0]
    assert "convolution" not in ops and ops & {"mm", "addmm", "bmm"}     # no cuDNN call: a GEMM ran
    assert cat[out].shape == fp32[out].shape and st.is_channels_last(cat[out]) == channels_last
    assert torch.allclose(cat[out], fp32[out], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,weight,length", [({"stride": [2]}, (10, 8, 1), 130), ({"padding": [1]}, (10, 8, 1), 130),
                                                 ({"groups": 2}, (10, 4, 1), 130), ({}, (10, 8, 3), 130),
                                                 ({}, (10, 8, 1), 127)],
                         ids=["strided", "padded", "grouped", "3_taps", "short_image"])
def test_other_convolutions_keep_the_cudnn_call(attrs, weight, length):
    p, n = _program("conv1d", [(3, 8, length), weight], attrs)
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(3, 8, length)
    with _AtenOps() as ops:
        st.run_split_tf32_cat(p, n.id, env)
    assert "convolution" in ops and not ops & {"mm", "addmm", "bmm"}


class _AtenOps(TorchDispatchMode):
    """The names of the aten ops run inside (convolution, mm, ...)."""
    def __enter__(self):
        self.names = set()
        super().__enter__()
        return self.names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_gemms_concatenated_form_is_one_gemm_over_three_times_k():
    p, n = _program("linear", [(8, 3, 40), (9, 40), (9,)], {})
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(8, 3, 40)
    calls = []

    class Shapes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("mm", "addmm", "bmm"):
                calls.append([a for a in args if isinstance(a, torch.Tensor)])
            return func(*args, **(kwargs or {}))
    with Shapes():
        st.run_split_tf32_cat(p, n.id, env)
    [[bias, a, bt]] = calls
    assert [tuple(t.shape) for t in (bias, a, bt)] == [(9,), (24, 120), (120, 9)]
    # the small products first (lo*hi, hi*lo, then hi*hi): the reduction runs along K in order
    a_hi, a_lo = st.split_tf32(env[p.inputs[0]].reshape(24, 40))
    w_hi, w_lo = st.split_tf32(env[n.inputs[1]])
    assert torch.equal(a, torch.cat([a_lo, a_hi, a_hi], 1))
    assert torch.equal(bt, torch.cat([w_hi, w_lo, w_hi], 1).t())


def test_a_transposed_operand_is_concatenated_in_its_own_memory_order():
    """q @ k.transpose(-2, -1): k's parts go along its contiguous dim and come back transposed (the
    split kernel's one launch needs rows it can write whole), the same sum as fp32."""
    q, k = torch.randn(2, 7, 12), torch.randn(2, 9, 12)
    kt = k.transpose(-2, -1)
    cat = st.cat_parts(kt, 1, st.B_LO)
    assert cat.shape == (2, 36, 9) and cat.mT.is_contiguous()
    hi, lo = st.split_tf32(kt)
    assert torch.equal(cat, torch.cat([hi, lo, hi], 1))
    p = Program("qk")
    a, b = p.add_input("q", (2, 7, 12)), p.add_input("kt", (2, 12, 9))
    n = p.add_node("matmul", [a.id, b.id])
    p.mark_output(n.outputs[0])
    env = {a.id: q, b.id: kt}
    st.run_split_tf32_cat(p, n.id, env)
    assert torch.allclose(env[n.outputs[0]], q @ kt, rtol=1e-5, atol=1e-5)


def test_a_matmul_of_a_vector_has_no_concatenated_form():
    p, n = _program("matmul", [(5, 30), (30,)], {})
    assert st.can_split(p, n.id) and not st.can_concatenate(p, n.id)


def test_a_grouped_concatenation_keeps_each_groups_parts_together():
    x = torch.randn(2, 6, 5)
    hi, lo = st.split_tf32(x)
    dst = torch.empty(2, 18, 5)
    st.split_cat_into(x, dst, 1, st.B_LO, groups=3)
    want = torch.cat([torch.cat([h, l, h], 1) for h, l in zip(hi.chunk(3, 1), lo.chunk(3, 1))], 1)
    assert torch.equal(dst, want)
    assert st._cat_rows(x, dst, 1, 3) == 10                       # a group's 2 channels x 5
    cl, dst_cl = x.view(2, 6, 5, 1).contiguous(memory_format=torch.channels_last), \
        torch.empty(2, 18, 5, 1, memory_format=torch.channels_last)
    assert st._cat_rows(cl, dst_cl, 1, 3) == 2                    # a group's channels at one position


def test_the_chooser_prefers_the_more_accurate_form_unless_another_is_clearly_faster():
    from agent_core.agent.precision import pick
    assert pick({"fp32": 1.0, "3xtf32": 0.97}, []) == "fp32"
    assert pick({"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.49}, []) == "3xtf32"
    assert pick({"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.3}, []) == "3xtf32-cat"
    assert pick({"fp32": 1.0, "3xtf32": 0.5, "3xtf32-cat": 0.3}, ["3xtf32-cat"]) == "3xtf32"
    assert pick({"fp32": 1.0, "fp32-timed": 0.6, "3xtf32": 0.58}, []) == "fp32-timed"
    assert pick({"fp32": 1.0, "3xtf32": 0.5}, ["3xtf32"]) == "fp32"


def test_run_library_node_follows_the_programs_choice(monkeypatch):
    p, n = _program(*CASES[0])
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(CASES[0][1][0])
    calls = []
    monkeypatch.setattr(st, "run_split_tf32", lambda prog, nid, e, *a, **k: calls.append(nid) or run_node(prog, nid, e))
    st.run_library_node(p, n.id, dict(env))
    assert calls == []                                   # no choice: plain fp32
    p.metadata["library_precision"] = {n.id: st.TF32X3}
    st.run_library_node(p, n.id, dict(env))
    assert calls == [n.id]
    timed = []
    monkeypatch.setattr(st, "run_timed_fp32", lambda prog, nid, e: timed.append(nid) or run_node(prog, nid, e))
    p.metadata["library_precision"] = {n.id: st.TIMED_FP32}
    st.run_library_node(p, n.id, dict(env))
    assert calls == [n.id] and timed == [n.id]
    cat = []
    monkeypatch.setattr(st, "run_split_tf32_cat", lambda prog, nid, e, *a, **k: cat.append(nid) or run_node(prog, nid, e))
    p.metadata["library_precision"] = {n.id: st.TF32X3_CAT}
    st.run_library_node(p, n.id, dict(env))
    assert calls == [n.id] and timed == [n.id] and cat == [n.id]
    assert st.can_split(p, n.id)
    relu = p.add_node("relu", [n.outputs[0]])
    assert not st.can_split(p, relu.id)


def test_parameters_are_split_once_and_again_after_an_in_place_change():
    w = torch.randn(8, 8)
    first = st._cached_split(w)
    assert st._cached_split(w) is first
    w.mul_(2)
    again = st._cached_split(w)
    assert again is not first and torch.equal(again[0], st.split_tf32(w)[0])
    key = (id(w), "split")
    del w, first, again
    assert key not in st._param_splits


def test_library_flags_are_restored_after_the_calls():
    def flags():
        return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    saved = flags()
    with st.tf32_tensor_cores():
        assert flags()[:3] == (True, True, True)
    assert flags() == saved
    with pytest.raises(RuntimeError), st.cudnn_timed():
        assert flags()[2:] == (True, True)
        raise RuntimeError("a failing call")
    assert flags() == saved


def test_the_floor_counts_split_flops_at_three_tf32_products():
    assert effective_tflops(1e12, 0) == pytest.approx(FP32_TFLOPS)
    assert effective_tflops(1e12, 1e12) == pytest.approx(TF32_TFLOPS / 3)
    half = effective_tflops(2e12, 1e12)
    assert FP32_TFLOPS < half < TF32_TFLOPS / 3
