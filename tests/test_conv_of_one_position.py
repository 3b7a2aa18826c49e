"""A convolution with one output position is a linear layer (rewrites/linear_reduce.conv_of_one_position):
squeeze-and-excitation's 1x1 convolutions of a pooled [N, C, 1, 1] map, grouped ones, a classifier
convolution whose kernel covers its whole map. The rewritten program matches on random draws; a
convolution with more than one output position (padding, a larger map, dilation) stays; the
EfficientNet squeeze-excitation block plans through the CLI with its two convolutions as cuBLAS GEMMs."""
import numpy as np
import pytest
import torch

from agent_core.ir import Program
from agent_core.reference import random_inputs, run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.linear_reduce import conv_of_one_position
from tests.programs import cli


def _conv(x_shape, w_shape, bias=True, **attrs):
    p = Program("conv")
    x = p.add_input("x", x_shape)
    rng = np.random.default_rng(0)
    w = p.add_parameter("weight", rng.standard_normal(w_shape).astype(np.float32))
    ins = [x.id, w.id]
    if bias:
        ins.append(p.add_parameter("bias", rng.standard_normal(w_shape[:1]).astype(np.float32)).id)
    op = f"conv{len(x_shape) - 2}d"
    full = {"stride": [1] * (len(x_shape) - 2), "padding": [0] * (len(x_shape) - 2),
            "dilation": [1] * (len(x_shape) - 2), "groups": 1, **attrs}
    p.mark_output(p.add_node(op, ins, full).outputs[0])
    return p


@pytest.mark.parametrize("x_shape,w_shape,bias,attrs", [
    ((16, 240, 1, 1), (10, 240, 1, 1), True, {}),              # SE reduce (EfficientNet-B0)
    ((16, 10, 1, 1), (240, 10, 1, 1), True, {}),               # SE expand
    ((8, 64, 1, 1), (32, 16, 1, 1), False, {"groups": 4}),     # grouped: a block-diagonal weight
    ((4, 32, 5, 5), (100, 32, 5, 5), True, {"stride": [2, 2]}),  # a classifier over a whole 5x5 map
    ((4, 12, 7), (20, 12, 7), True, {}),                       # 1-d
])
def test_a_convolution_of_one_output_position_is_a_linear(x_shape, w_shape, bias, attrs):
    p = _conv(x_shape, w_shape, bias, **attrs)
    result = rewrite_program(p, rules=[conv_of_one_position], check=False)
    assert result.rules_fired == {"conv_of_one_position": 1}
    ops = [n.op for n in result.program.nodes.values()]
    assert "linear" in ops and not any(o.startswith("conv") for o in ops), ops
    for seed in range(3):
        drawn = random_inputs(p, seed)
        want = next(iter(run_reference(p, drawn).values()))
        got = next(iter(run_reference(result.program, drawn).values()))
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 8, 1, 1), (4, 8, 1, 1), {"padding": [1, 1]}),        # padded: a 3x3 output
    ((2, 8, 4, 4), (4, 8, 1, 1), {}),                          # a 1x1 convolution over 16 positions
    ((2, 8, 5, 5), (4, 8, 3, 3), {"dilation": [2, 2]}),        # dilated taps
])
def test_a_convolution_with_several_positions_stays(x_shape, w_shape, attrs):
    p = _conv(x_shape, w_shape, **attrs)
    assert rewrite_program(p, rules=[conv_of_one_position], check=False).rules_fired == {}


def test_squeeze_excitation_plans_its_convolutions_as_gemms():
    r = cli("plan", "benchmarks/blocks/squeeze_excitation_efficientnet_b0.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("rewrite conv_of_one_position") == 2, r.stdout
    assert "linear layer (240 -> 10)" in r.stdout and "linear layer (10 -> 240)" in r.stdout, r.stdout
    assert "cuDNN" not in r.stdout, r.stdout
