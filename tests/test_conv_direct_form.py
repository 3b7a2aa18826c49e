"""The direct convolution (codegen/conv.py, fp32 FFMA) as a form the tuner times against cuDNN (+ the
epilogue kernel) and the implicit GEMM, for a convolution whose reduction per output element is short
(conv.DIRECT_MAX_REDUCTION): which regions offer it, in which order, and that the kernel generated for
the form matches torch in the CPU emulator. tests/test_agent_mockgpu.py drives the agent keeping it."""
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.codegen.conv import DIRECT
from agent_core.ir import Program
from tests.programs import emulated


def _conv(cin, cout, kernel=(3, 3), *, op="conv2d", epilogue=True, shape=(2, None, 12, 12), stride=1):
    p = Program("conv")
    x = p.add_input("x", [shape[0], cin, *shape[2:]]).id
    w_shape = [cin, cout, *kernel] if op.startswith("conv_transpose") else [cout, cin, *kernel]
    ins = [x, p.add_parameter("w", shape=w_shape).id, p.add_parameter("b", shape=[cout]).id]
    attrs = {"stride": [stride] * len(kernel), "padding": [1] * len(kernel), "dilation": [1] * len(kernel),
             "groups": 1}
    if op.startswith("conv_transpose"):
        attrs["output_padding"] = [stride - 1] * len(kernel)
    y = p.add_node(op, ins, attrs).outputs[0]
    if epilogue:
        y = p.add_node("mul_scalar", [p.add_node("relu", [y]).outputs[0]], {"value": 2.0}).outputs[0]
    p.mark_output(y)
    return p


@pytest.mark.parametrize("cin,op,offered", [(8, "conv2d", True), (3, "conv2d", True), (28, "conv2d", True),
                                            (29, "conv2d", False), (64, "conv2d", False),
                                            (8, "conv_transpose2d", True)])
def test_a_convolution_and_its_epilogue_offer_the_direct_form_after_the_tile_gemms_default(cin, op, offered):
    p = _conv(cin, 16, op=op)
    ks = generate_kernel(p, list(p.nodes), name="r")
    assert ks.library_nodes, "the default runs the convolution through cuDNN"
    forms = [a.get("form") for a in ks.alternatives]
    assert (DIRECT in forms) == offered, forms
    if offered and op == "conv2d":
        assert forms.index(DIRECT) == 1 and forms[0] == "gemm-3xtf32"


def test_a_compute_bound_convolution_alone_offers_the_direct_form_when_thin():
    p = _conv(16, 32, epilogue=False, shape=(8, None, 32, 32))
    ks = generate_kernel(p, list(p.nodes), name="r")
    assert ks.kind == "gemm" and ks.alternatives == [{"form": DIRECT, "positions_per_thread": 4, "stage_weights": True},
                                                     {"form": DIRECT, "positions_per_thread": 4}]


def test_the_direct_form_takes_4_positions_a_thread_where_rows_allow():
    def offered(p):
        return generate_kernel(p, list(p.nodes), name="r").alternatives
    assert {"form": DIRECT, "positions_per_thread": 4} in offered(_conv(8, 16))
    assert {"form": DIRECT} in offered(_conv(8, 16, shape=(2, None, 12, 6)))          # rows of 6
    # a transposed convolution's positions q each take the stride's outputs: 4 outputs are 2 positions at
    # stride 2, in rows of at least 2 x 2 positions
    assert {"form": DIRECT, "positions_per_thread": 4} in offered(_conv(8, 16, op="conv_transpose2d"))
    assert {"form": DIRECT, "positions_per_thread": 2} in offered(_conv(8, 16, op="conv_transpose2d", stride=2))
    assert {"form": DIRECT} in offered(_conv(8, 16, op="conv_transpose2d", stride=2, shape=(2, None, 12, 2)))  # 2


def _transposed_alone(cin, kernel=(3, 3, 3)):
    """conv_transpose3d (stride 2) alone before a softmax over its channels, as level 2's 49 has it."""
    p = Program("convt")
    x = p.add_input("x", [2, cin, 6, 8, 8]).id
    w = p.add_parameter("w", shape=[cin, 16, *kernel]).id
    y = p.add_node("conv_transpose3d", [x, w], {"stride": [2] * 3, "padding": [1] * 3, "dilation": [1] * 3,
                                                "output_padding": [1] * 3, "groups": 1}).outputs[0]
    p.mark_output(p.add_node("softmax", [y], {"dim": 1}).outputs[0])
    return p, next(n for n in p.nodes.values() if n.op == "conv_transpose3d").id


@pytest.mark.parametrize("cin,ours", [(32, True), (128, True), (129, False)])
def test_a_transposed_convolution_alone_gets_the_direct_form_where_a_phase_reduction_is_short(cin, ours):
    """Its own region (the softmax over channels cannot follow it into one kernel) gets the direct form,
    staged first, while input channels x a phase's taps (at most 2x2x2 of the 27 at stride 2) stay within
    conv.DIRECT_MAX_REDUCTION_TRANSPOSED; deeper ones stay cuDNN's. The plan says which."""
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.planner import plan_program
    p, nid = _transposed_alone(cin)
    (region,) = [r for r in plan_program(p).regions if nid in r.nodes]
    if not ours:
        assert without_kernel(p, [nid])[0] == "library"
        assert "direct convolution" not in region.reason, region.reason
        return
    assert without_kernel(p, [nid]) is None
    ks = generate_kernel(p, [nid], name="r")
    assert ks.kind == "convolution" and not ks.library_nodes and ks.grid[2] == 4     # residues of d and h
    assert ks.params["form"] == DIRECT and ks.params["stage_weights"] and ks.params["positions_per_thread"] == 2
    assert ks.params["outputs_per_thread"] == 4           # both residues of w at 2 positions
    assert ks.alternatives == [{"form": DIRECT, "positions_per_thread": 2}]
    from agent_core.agent.tune import tune_space
    staged = {"form": DIRECT, "positions_per_thread": 2, "stage_weights": True}
    assert tune_space(ks, arch="sm_90")[1:] == [{**staged, "channels_per_thread": 1, "block": 128}]  # a small grid
    cpt = 16 if cin == 32 else 8     # 128 channels x 2 x 2 x 3 taps x 16 would pass the 48 KB of staged weights
    wide = generate_kernel(p, [nid], name="r", params={"channels_per_thread": cpt})
    assert tune_space(wide, arch="sm_90")[1:] == [{**staged, "channels_per_thread": cpt // 2},
                                                  {**staged, "channels_per_thread": cpt, "block": 128}]
    for params in tune_space(wide, arch="sm_90"):      # each generates
        assert generate_kernel(p, [nid], name="r", params=params).params["form"] == DIRECT
    assert "cuDNN's fp32 runs transposed convolutions far below the FMA units' peak" in region.reason, region.reason
    assert "one thread per 4 consecutive output positions (2 positions x the stride's 2 residues) of one phase" \
        in region.reason, region.reason


@pytest.mark.parametrize("op,kernel,extra", [("conv2d", (3, 3), {"positions_per_thread": 4}), ("conv2d", (3, 3), {}),
                                             ("conv_transpose2d", (3, 3), {}), ("conv1d", (5,), {"positions_per_thread": 4})])
def test_the_direct_form_is_the_generated_convolution_and_matches_torch(op, kernel, extra):
    shape = (2, None, 9, 10) if len(kernel) == 2 else (2, None, 41)
    p = _conv(6, 12, kernel, op=op, shape=shape)
    ks = generate_kernel(p, list(p.nodes), name="r", params={"form": DIRECT, **extra})
    assert ks.kind == "convolution" and not ks.library_nodes and ks.params["form"] == DIRECT
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(p.values[v].shape) for v in p.inputs])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("kernel,ours", [((3, 3), True), ((1, 1), False)], ids=["rgb-3x3", "rgb-1x1"])
def test_a_memory_bound_convolution_of_few_channels_alone_gets_our_forms_through_a_spatial_kernel(kernel, ours):
    """An RGB 3x3 convolution alone is memory-bound by its bytes, but cuDNN's fp32 runs it far from them:
    its region gets the implicit GEMM (and the direct convolution) to time against cuDNN, and the plan
    says why. A 1x1 one over the same channels stays cuDNN's."""
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.analysis.cost import node_cost
    p = _conv(3, 16, kernel, epilogue=False, shape=(128, None, 64, 64))
    (nid,) = list(p.nodes)
    assert node_cost(p, nid).bound() == "memory"
    if not ours:
        assert without_kernel(p, [nid])[0] == "library"
        return
    assert without_kernel(p, [nid]) is None
    ks = generate_kernel(p, [nid], name="r")
    assert ks.kind == "gemm" and ks.alternatives == [{"form": DIRECT, "positions_per_thread": 4, "stage_weights": True},
                                                     {"form": DIRECT, "positions_per_thread": 4}]
    from agent_core.planner import plan_program
    (region,) = [r for r in plan_program(p).regions if nid in r.nodes]
    assert "it reads few input channels, where cuDNN's fp32 is slow" in region.reason, region.reason
    assert ("the direct convolution (fp32 FFMA, one thread per 4 consecutive output positions) is timed too, "
            "with its weights staged in shared memory and without" in region.reason), region.reason


def test_a_transposed_convolution_with_a_view_of_its_output_gets_the_direct_form_and_matches_torch():
    """conv_transpose2d -> flatten, alone in its region: the view is written at the convolution's flat
    index, so the region is still the direct form's (it stayed cuDNN's while the view was there), and
    the kernel matches torch in the CPU emulator."""
    from agent_core.agent.region_kinds import without_kernel
    p = Program("convt_view")
    x = p.add_input("x", [2, 8, 5, 6]).id
    w = p.add_parameter("w", shape=[8, 12, 3, 3]).id
    y = p.add_node("conv_transpose2d", [x, w], {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1],
                                                "output_padding": [1, 1], "groups": 1}).outputs[0]
    p.mark_output(p.add_node("flatten", [y], {"start_dim": 1, "end_dim": -1}).outputs[0])
    ids = list(p.nodes)
    assert without_kernel(p, ids) is None
    ks = generate_kernel(p, ids, name="r")
    assert ks.kind == "convolution" and ks.params["form"] == DIRECT and not ks.library_nodes
    assert list(p.values[ks.outputs[0]].shape) == [2, 12 * 10 * 12]
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(2, 8, 5, 6)])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
