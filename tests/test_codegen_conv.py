"""Generated convolutions (the export's kind="convolution"): every conv example and a set of odd
configurations (1-D/2-D/3-D, transposed, groups, dilation, stride 2/3, output_padding, no bias, 1x1,
batch 1, unbatched, 'same' padding, several channels per thread, epilogue chains) generate and compile
to sm_90 without a warning; unsupported regions are refused with a reason.

Numerics without a GPU: the generated kernel source itself is compiled for the host with g++ (CUDA's
keywords and built-ins defined away, every block and thread of the launch run in turn; the kernels
use no shared memory, no synchronisation and no atomics, so that is exactly the GPU's result up to
FMA contraction) and checked by agent_core.verify against the torch reference on the CPU."""
import ctypes
import math
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.verify import verify_region

from tests.test_codegen_clean import unused_helpers

EXAMPLES = ["conv1d_basic", "conv2d_bias_relu", "conv2d_strided_grouped", "conv3d_small",
            "conv3d_softmax_maxpool", "conv_bn_relu", "conv_transpose1d_upsample",
            "conv_transpose2d_add_hardswish", "conv_transpose2d_upsample", "conv_transpose3d_small"]


def conv_program(op, x_shape, w_shape, bias=True, epilogue=(), outputs=("last",), **attrs):
    """x -> op(x, weight[, bias]) -> epilogue: the program and the region's node ids.

    epilogue: (op, attrs, extra input shapes) per node, each reading the previous node's output first;
    an extra shape "out" is the convolution's output shape. outputs: "last", "conv" (the convolution's
    own output leaves the region too)."""
    p = Program(op)
    x = p.add_input("x", x_shape)
    ins = [x.id, p.add_parameter("weight", shape=w_shape).id]
    if bias:
        cout = w_shape[0] if not op.startswith("conv_transpose") else w_shape[1] * attrs.get("groups", 1)
        ins.append(p.add_parameter("bias", shape=[cout]).id)
    n = p.add_node(op, ins, attrs)
    ids, cur = [n.id], n.outputs[0]
    out_shape = p.values[cur].shape
    for k, (eop, eattrs, extra) in enumerate(epilogue):
        more = [p.add_input(f"e{k}_{j}", out_shape if s == "out" else s).id for j, s in enumerate(extra)]
        e = p.add_node(eop, [cur, *more], eattrs)
        ids.append(e.id)
        cur = e.outputs[0]
    if "conv" in outputs and ids[1:]:
        p.mark_output(n.outputs[0])
    p.mark_output(cur)
    return p, ids


# name -> (conv_program arguments, params)
CASES = {
    "conv1d_pad": (dict(op="conv1d", x_shape=(2, 4, 9), w_shape=(6, 4, 3), padding=[1]), None),
    # several consecutive positions a thread (a weight feeds each): ragged rows, strides, dilation, groups
    "conv2d_4_positions_ragged_row": (dict(op="conv2d", x_shape=(2, 3, 9, 7), w_shape=(8, 3, 3, 3), padding=[1],
                                           epilogue=[("relu", {}, [])]),
                                      {"positions_per_thread": 4, "channels_per_thread": 4}),
    "conv1d_3_positions_s2_d2": (dict(op="conv1d", x_shape=(2, 4, 23), w_shape=(6, 4, 3), stride=[2], padding=[2],
                                      dilation=[2]), {"positions_per_thread": 3}),
    "conv3d_2_positions_g2": (dict(op="conv3d", x_shape=(1, 4, 5, 6, 5), w_shape=(6, 2, 3, 3, 3), stride=[2],
                                   padding=[1], groups=2, bias=False), {"positions_per_thread": 2}),
    "conv1d_s3_d2_g2_nobias": (dict(op="conv1d", x_shape=(3, 4, 20), w_shape=(6, 2, 4), bias=False,
                                    stride=[3], padding=[2], dilation=[2], groups=2), None),
    "conv2d_1x1_batch1": (dict(op="conv2d", x_shape=(1, 5, 7, 9), w_shape=(3, 5, 1, 1)), None),
    "conv2d_s2_g2_odd": (dict(op="conv2d", x_shape=(2, 4, 11, 13), w_shape=(6, 2, 3, 3), stride=[2],
                              padding=[1], groups=2), None),
    "conv2d_rect_dilated": (dict(op="conv2d", x_shape=(2, 3, 10, 9), w_shape=(4, 3, 3, 2), stride=[1, 2],
                                 padding=[1, 2], dilation=[2, 3]), None),
    "conv2d_depthwise": (dict(op="conv2d", x_shape=(2, 6, 8, 8), w_shape=(6, 1, 3, 3), padding=[1],
                              groups=6), None),
    "conv2d_same_even_kernel": (dict(op="conv2d", x_shape=(1, 3, 7, 8), w_shape=(4, 3, 4, 2),
                                     padding="same", dilation=[1, 3]), None),
    "conv2d_valid_s3": (dict(op="conv2d", x_shape=(2, 2, 10, 8), w_shape=(2, 2, 3, 3), padding="valid",
                             stride=[3]), None),
    "conv2d_unbatched": (dict(op="conv2d", x_shape=(3, 8, 7), w_shape=(4, 3, 3, 3), padding=[1]), None),
    "conv2d_2_channels_per_thread": (dict(op="conv2d", x_shape=(2, 4, 7, 7), w_shape=(8, 2, 3, 3),
                                          padding=[1], groups=2), {"channels_per_thread": 2}),
    "conv2d_4_channels_per_thread": (dict(op="conv2d", x_shape=(1, 3, 6, 5), w_shape=(8, 3, 3, 3),
                                          stride=[2]), {"channels_per_thread": 4}),
    "conv3d_s2_g2": (dict(op="conv3d", x_shape=(1, 4, 5, 6, 4), w_shape=(6, 2, 3, 3, 3), stride=[2],
                          padding=[1], groups=2), None),
    "conv3d_dilated_nobias": (dict(op="conv3d", x_shape=(2, 2, 7, 6, 5), w_shape=(3, 2, 2, 3, 2),
                                   bias=False, dilation=[2, 1, 2], padding=[0, 1, 1]), None),
    "convT1d_s2_op1": (dict(op="conv_transpose1d", x_shape=(2, 4, 9), w_shape=(4, 3, 3), stride=[2],
                            padding=[1], output_padding=[1]), None),
    "convT1d_s3_d2_g2_nobias": (dict(op="conv_transpose1d", x_shape=(1, 4, 7), w_shape=(4, 2, 4),
                                     bias=False, stride=[3], padding=[2], output_padding=[1],
                                     dilation=[2], groups=2), None),
    "convT2d_s2_g2_op1": (dict(op="conv_transpose2d", x_shape=(2, 4, 5, 6), w_shape=(4, 3, 3, 3),
                               stride=[2], padding=[1], output_padding=[1], groups=2), None),
    "convT2d_mixed_nobias": (dict(op="conv_transpose2d", x_shape=(1, 3, 4, 5), w_shape=(3, 2, 2, 3),
                                  bias=False, stride=[3, 2], padding=[0, 1], output_padding=[2, 1],
                                  dilation=[1, 2]), None),
    "convT2d_stride1": (dict(op="conv_transpose2d", x_shape=(2, 3, 5, 5), w_shape=(3, 4, 3, 3),
                             padding=[1]), None),
    "convT2d_gaps": (dict(op="conv_transpose2d", x_shape=(1, 2, 4, 4), w_shape=(2, 2, 2, 2),
                          stride=[3]), None),
    "convT2d_1x1_batch1": (dict(op="conv_transpose2d", x_shape=(1, 5, 3, 4), w_shape=(5, 2, 1, 1)), None),
    "convT3d_s2_g2_op1": (dict(op="conv_transpose3d", x_shape=(1, 4, 3, 4, 3), w_shape=(4, 3, 3, 3, 3),
                               stride=[2], padding=[1], output_padding=[1], groups=2), None),
    "convT3d_dilated_4ch": (dict(op="conv_transpose3d", x_shape=(2, 2, 3, 3, 2), w_shape=(2, 4, 2, 2, 3),
                                 stride=[1, 2, 2], dilation=[2, 1, 1], padding=[1, 0, 1]),
                            {"channels_per_thread": 4}),
    # a transposed convolution phase by phase, several positions (a stride apart) a thread: a 4-tap
    # kernel at stride 2 (2 taps a phase), a 5-tap one (3 or 2), dilation 2 at stride 2 (a phase with
    # no tap: only the bias), ragged rows
    "convT3d_4_positions_k4_s2": (dict(op="conv_transpose3d", x_shape=(2, 3, 3, 4, 9), w_shape=(3, 4, 4, 4, 4),
                                       stride=[2], padding=[1]), {"positions_per_thread": 4, "channels_per_thread": 2}),
    "convT2d_2_positions_k5_s2": (dict(op="conv_transpose2d", x_shape=(1, 2, 6, 7), w_shape=(2, 3, 5, 5),
                                       stride=[2], padding=[2], epilogue=[("relu", {}, [])]),
                                  {"positions_per_thread": 2}),
    "convT1d_3_positions_d2_s2": (dict(op="conv_transpose1d", x_shape=(2, 3, 11), w_shape=(3, 4, 5), stride=[2],
                                       dilation=[2], padding=[3], output_padding=[1]),
                                  {"positions_per_thread": 3}),
    "conv2d_epilogue_chain": (dict(op="conv2d", x_shape=(2, 3, 9, 7), w_shape=(4, 3, 3, 3), padding=[1],
                                   bias=False, outputs=("conv", "last"), epilogue=[
                                       ("add", {}, [(4, 1, 1)]), ("relu", {}, []),
                                       ("mul_scalar", {"value": 0.5}, []), ("add", {}, ["out"]),
                                       ("gelu", {"approximate": "tanh"}, [])]), {"channels_per_thread": 2}),
    "conv2d_batch_norm_hardswish": (dict(op="conv2d", x_shape=(2, 4, 6, 6), w_shape=(8, 4, 3, 3),
                                         epilogue=[("batch_norm", {"eps": 1e-5}, [(8,), (8,), (8,), (8,)]),
                                                   ("hardswish", {}, [])]), None),
    "convT2d_sigmoid_where": (dict(op="conv_transpose2d", x_shape=(2, 4, 5, 5), w_shape=(4, 2, 3, 3),
                                   stride=[2], padding=[1], output_padding=[1], epilogue=[
                                       ("sigmoid", {}, []), ("mul", {}, [(10, 1)])]),
                              {"channels_per_thread": 2}),
    "conv1d_epilogue_tanh": (dict(op="conv1d", x_shape=(1, 3, 17), w_shape=(5, 3, 5), stride=[2],
                                  padding=[2], epilogue=[("tanh", {}, []), ("sub_scalar", {"value": 0.1}, [])]),
                             None),
}


# weights staged in shared memory, a channel chunk per blockIdx.y: float4 reads of 4 channels (8 and 16 a
# thread), scalar ones (2, 3), groups, strides, dilation, a transposed gather, ragged rows, an epilogue.
# Threads share the staged weights after __syncthreads, so these run in the CPU emulator (threads of a
# block as fibers), not host_runner's one thread after another.
STAGED = {
    "conv3d_staged_rgb_16ch": (dict(op="conv3d", x_shape=(2, 3, 5, 6, 9), w_shape=(16, 3, 3, 3, 3), padding=[1],
                                    epilogue=[("relu", {}, [])]),
                               {"stage_weights": True, "positions_per_thread": 4, "channels_per_thread": 16}),
    "conv3d_staged_8ch_valid": (dict(op="conv3d", x_shape=(1, 3, 4, 5, 11), w_shape=(16, 3, 3, 3, 3)),
                                {"stage_weights": True, "positions_per_thread": 4, "channels_per_thread": 8}),
    "conv2d_staged_g2_s2": (dict(op="conv2d", x_shape=(2, 4, 9, 11), w_shape=(8, 2, 3, 3), stride=[2],
                                 padding=[1], groups=2),
                            {"stage_weights": True, "positions_per_thread": 3, "channels_per_thread": 2}),
    "conv1d_staged_dilated": (dict(op="conv1d", x_shape=(2, 4, 30), w_shape=(8, 4, 3), stride=[2], padding=[2],
                                   dilation=[2], bias=False),
                              {"stage_weights": True, "positions_per_thread": 4, "channels_per_thread": 4}),
    "convT2d_staged_g2": (dict(op="conv_transpose2d", x_shape=(2, 4, 5, 6), w_shape=(4, 3, 3, 3), stride=[2],
                               padding=[1], output_padding=[1], groups=2),
                          {"stage_weights": True, "channels_per_thread": 3}),
    "convT3d_staged_8ch_4_positions": (dict(op="conv_transpose3d", x_shape=(2, 4, 3, 4, 6), w_shape=(4, 8, 3, 3, 3),
                                            stride=[2], padding=[1], output_padding=[1], epilogue=[("sigmoid", {}, [])]),
                                       {"stage_weights": True, "positions_per_thread": 4, "channels_per_thread": 8}),
    "convT2d_staged_empty_phase": (dict(op="conv_transpose2d", x_shape=(1, 3, 5, 9), w_shape=(3, 4, 3, 5), stride=[2],
                                        dilation=[1, 2], padding=[1, 3]),
                                   {"stage_weights": True, "positions_per_thread": 2, "channels_per_thread": 4}),
}


def _positive_variances(p):
    """batch_norm's running_var must be positive (the draw is a normal)."""
    for node in p.nodes.values():
        if node.op == "batch_norm":
            p.values[node.inputs[2]].init = {"kind": "positive"}
    return p


def build(case):
    kwargs, params = CASES[case]
    p, ids = conv_program(**kwargs)
    return _positive_variances(p), ids, params


# --- the generated source, run on the host -------------------------------------------------------
HOST_SHIM = r"""
#include <math.h>
#include <algorithm>
using std::max;
using std::min;
struct HostDim3 { unsigned x = 0, y = 1, z = 1; };
static HostDim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
static inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
"""


def host_runner(ks, tmp_path, grid=None):
    """Compile the kernel's source for the host and return run(input tensors) -> output tensors,
    launching every block and thread of `grid` (default: the kernel's own) one after another."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no host C++ compiler to run the generated source on the CPU")
    grid = grid or ks.grid[0]
    n_args = len(ks.inputs) + len(ks.outputs)
    driver = (f'\nextern "C" void host_launch(float** args) {{\n'
              f"  gridDim.x = {grid}; gridDim.y = {ks.grid[1]}; gridDim.z = {ks.grid[2]}; blockDim.x = {ks.block[0]};\n"
              f"  for (unsigned z = 0; z < gridDim.z; ++z)\n"
              f"  for (unsigned y = 0; y < gridDim.y; ++y)\n"
              f"  for (unsigned b = 0; b < gridDim.x; ++b)\n"
              f"    for (unsigned t = 0; t < blockDim.x; ++t) {{\n"
              f"      blockIdx.x = b; blockIdx.y = y; blockIdx.z = z; threadIdx.x = t;\n"
              f"      {ks.name}({', '.join(f'args[{i}]' for i in range(n_args))});\n"
              f"    }}\n}}\n")
    src = tmp_path / f"{ks.name}_host.cpp"
    src.write_text(HOST_SHIM + ks.source + driver)
    lib = tmp_path / f"{ks.name}_host.so"
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off",
                        "-Wno-unknown-pragmas", str(src), "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    fn = ctypes.CDLL(str(lib)).host_launch
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def run(ins):
        arrays = [np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32) for t in ins]
        outs = [np.full(ks_shapes[v], np.nan, dtype=np.float32) for v in ks.outputs]
        ptrs = (ctypes.c_void_p * n_args)(*[a.ctypes.data for a in arrays + outs])
        fn(ptrs)
        return [torch.from_numpy(o) for o in outs]

    ks_shapes = {}
    return run, ks_shapes


def check_on_host(p, ks, tmp_path, draws=2, grid=None):
    run, shapes = host_runner(ks, tmp_path, grid)
    shapes.update({v: tuple(p.values[v].shape) for v in ks.outputs})
    res = verify_region(p, ks.inputs, ks.outputs, run, draws=draws, device="cpu")
    assert res.ok, res.reason
    return res


def compile_clean(ks):
    assert unused_helpers(ks.source) == []
    log = compile_kernel(ks, arch="sm_90").log
    warnings = [ln for ln in log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)


# --- the bundled examples ------------------------------------------------------------------------
def example_region(name):
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "resources" / "examples" / f"{name}.py"
    p = import_file(path)
    region = next(r for r in plan_program(p).active
                  if any(p.nodes[n].opdef.category == "convolution" for n in r.nodes))
    return p, region.nodes


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_generates_compiles_and_matches_on_host(name, tmp_path):
    p, ids = example_region(name)
    ks = generate_kernel(p, ids, name=name, kind="convolution")
    assert ks.kind == "convolution" and not ks.library_nodes
    assert ks.node_ids == list(ids) or set(ks.node_ids) == set(ids)
    compile_clean(ks)
    check_on_host(p, ks, tmp_path, draws=1)


# --- odd configurations --------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(CASES))
def test_configuration_compiles_and_matches_on_host(case, tmp_path):
    p, ids, params = build(case)
    ks = generate_kernel(p, ids, name=case, kind="convolution", params=params)
    if params and "channels_per_thread" in params:
        assert ks.params["channels_per_thread"] == params["channels_per_thread"]
    compile_clean(ks)
    check_on_host(p, ks, tmp_path)


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulator needs g++")
@pytest.mark.parametrize("case", list(STAGED))
def test_staged_weights_compile_and_match_torch_in_the_emulator(case):
    from agent_core.reference import random_inputs
    from tests.programs import emulated
    kwargs, params = STAGED[case]
    p, ids = conv_program(**kwargs)
    ks = generate_kernel(p, ids, name=case, kind="convolution", params=params)
    assert ks.params["stage_weights"] and ks.params["channels_per_thread"] == params["channels_per_thread"]
    assert ks.grid[1] == p.values[p.nodes[ids[0]].outputs[0]].shape[1] // params["channels_per_thread"]
    assert "__shared__ __align__(16) float ws[kStaged];" in ks.source
    assert ("const float4 w = w4[c4];" in ks.source) == (params["channels_per_thread"] % 4 == 0)
    compile_clean(ks)
    for seed in range(2):
        got, want = emulated(p, ks, random_inputs(p, seed=seed).values())
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def residual_program():
    """y = relu(conv2d(x) + x): the epilogue reads the convolution's own input (same shape)."""
    p = Program("residual")
    x = p.add_input("x", (2, 4, 6, 5))
    c = p.add_node("conv2d", [x.id, p.add_parameter("weight", shape=(4, 4, 3, 3)).id], {"padding": [1]})
    a = p.add_node("add", [c.outputs[0], x.id])
    r = p.add_node("relu", [a.outputs[0]])
    p.mark_output(r.outputs[0])
    return p, [c.id, a.id, r.id]


def test_epilogue_reading_the_convolution_input(tmp_path):
    p, ids = residual_program()
    ks = generate_kernel(p, ids, name="residual", kind="convolution")
    assert ks.inputs.count(p.inputs[0]) == 1
    compile_clean(ks)
    check_on_host(p, ks, tmp_path)


def test_grid_stride_loop_covers_every_output_with_a_small_grid(tmp_path):
    p, ids, params = build("convT2d_s2_g2_op1")
    ks = generate_kernel(p, ids, name="small_grid", kind="convolution", params=params)
    assert ks.grid[0] > 1
    check_on_host(p, ks, tmp_path, draws=1, grid=1)


def test_kernel_source_layout_header_and_launch():
    p, ids, _ = build("conv2d_epilogue_chain")
    ks = generate_kernel(p, ids, name="conv_chain", kind="convolution", params={"channels_per_thread": 2})
    src = ks.source
    conv = p.nodes[ids[0]]
    for nid in ids:  # every fused op is listed in the header
        assert f"//   {nid} " in src
    for text in ("Region conv_chain: conv2d [2, 3, 9, 7] * [4, 3, 3, 3] -> [2, 4, 9, 7]", "Inputs:  x float32[2, 3, 9, 7]",
                 "weight layout [Cout, Cin/groups, *kernel]", "schedule: one thread per output position and 2",
                 'extern "C" __global__ void __launch_bounds__(kBlock)', "const float* __restrict__ x",
                 "#pragma unroll", "for (int ci = 0; ci < kCinPerGroup; ++ci)", "constexpr int kChannelsPerThread = 2",
                 "kWeightStrideCo = kCinPerGroup * kKernelVolume", "const int ih = oh * kSH - kPH + kh * kDH;"):
        assert text in src, text
    assert "atomic" not in src
    assert ks.kind == "convolution" and ks.block == (256, 1, 1) and ks.grid[0] >= 1
    assert ks.inputs[:2] == conv.inputs[:2] and len(ks.outputs) == 2 and conv.outputs[0] in ks.outputs
    assert ks.flops == sum(p.node_flops(n) for n in ids) > 0
    assert ks.bytes_moved == sum(p.values[v].nbytes for v in ks.inputs + ks.outputs)
    assert ks.params["channels_per_thread"] == 2 and ks.schedule in src


def test_transposed_runs_phase_by_phase():
    """A transposed convolution's outputs o = q * stride + r of one residue r read the same taps: along
    every axis but the last, one residue per blockIdx.z (stride [3, 2]: 3 phases), each reading its own
    taps (no divisibility test per tap); along the last, a thread takes every residue of its positions,
    each tap's code written out for its residue. Dilation 2 at stride 2 puts every tap of w in residue 1
    (inputs q + 1, q, q - 1) and none in residue 0 (its outputs are the bias)."""
    p, ids, _ = build("convT2d_mixed_nobias")
    ks = generate_kernel(p, ids, name="gather", kind="convolution")
    src = ks.source
    assert ks.grid[2] == 3 and "x 3 phases" in ks.schedule
    assert "weight layout [Cin, Cout/groups, *kernel]" in src
    assert "constexpr int kQH = 5, kTapsH = 1, kTapStepH = 3, kInStepH = 1;" in src   # ceil(13 / 3) rows a phase
    assert "const int ih = qh + fh - jh * kInStepH;" in src and "% kSH != 0" not in src
    for k, off in ((0, 1), (1, 0), (2, -1)):
        assert f"residue 1: tap w = {k} reads input q + p + {off}" in src
    assert "residue 0:" not in src
    assert "kRun = kPositions * kSW" in src and "const index_t oc = out_base + (index_t)c * kOutSpatial + e;" in src
    p1, ids1, _ = build("convT2d_stride1")  # stride 1: one phase, every tap
    ks1 = generate_kernel(p1, ids1, name="gather1", kind="convolution")
    assert ks1.grid[2] == 1 and "kTapsH = 3, kTapStepH = 1, kInStepH = 1;" in ks1.source


def test_default_channels_per_thread_grows_with_the_problem():
    small, ids, _ = build("conv2d_1x1_batch1")
    assert generate_kernel(small, ids, name="s", kind="convolution").params["channels_per_thread"] == 1
    big, bids = conv_program("conv2d", (8, 16, 48, 48), (64, 16, 3, 3), padding=[1])
    ks = generate_kernel(big, bids, name="big", kind="convolution")
    assert ks.params["channels_per_thread"] == 4
    assert "typedef int index_t;" in ks.source
    compile_clean(ks)


def test_large_tensors_index_with_long_long():
    p, ids = conv_program("conv2d", (8, 64, 2048, 2048), (8, 64, 1, 1))
    ks = generate_kernel(p, ids, name="huge", kind="convolution")
    assert "typedef long long index_t;" in ks.source
    compile_clean(ks)


# --- refusals ------------------------------------------------------------------------------------
def _refused(p, ids, match, params=None):
    with pytest.raises(CodegenError, match=match):
        generate_kernel(p, ids, name="refused", kind="convolution", params=params)


def test_refuses_non_float32():
    p = Program("f64")
    x = p.add_input("x", (1, 2, 5, 5), dtype="float64")
    w = p.add_parameter("weight", shape=(3, 2, 3, 3), dtype="float64")
    n = p.add_node("conv2d", [x.id, w.id])
    p.mark_output(n.outputs[0])
    _refused(p, [n.id], "dtype float64; convolution kernels are generated for float32")


def test_refuses_two_convolutions_and_no_convolution():
    p, ids = conv_program("conv2d", (1, 2, 6, 6), (2, 2, 3, 3), padding=[1])
    second = p.add_node("conv2d", [p.nodes[ids[0]].outputs[0], p.nodes[ids[0]].inputs[1]], {"padding": [1]})
    p.mark_output(second.outputs[0])
    _refused(p, ids + [second.id], "exactly one conv/conv_transpose.*has 2")
    q = Program("none")
    r = q.add_node("relu", [q.add_input("x", (4, 4)).id])
    q.mark_output(r.outputs[0])
    _refused(q, [r.id], "has 0: none")


def test_refuses_a_prologue_and_a_reduction_after():
    p = Program("pro")
    x = p.add_input("x", (1, 2, 6, 6))
    r = p.add_node("relu", [x.id])
    c = p.add_node("conv2d", [r.outputs[0], p.add_parameter("weight", shape=(2, 2, 3, 3)).id])
    s = p.add_node("softmax", [c.outputs[0]], {"dim": 1})
    p.mark_output(s.outputs[0])
    _refused(p, [r.id, c.id], "input 'relu' is computed inside the region")
    _refused(p, [c.id, s.id], r"only pointwise ops and views of the result may follow .*split the region before .*softmax")


def test_refuses_unrelated_ops_and_larger_outputs():
    p, ids = conv_program("conv1d", (2, 3, 8), (4, 3, 3))
    other = p.add_node("relu", [p.add_input("y", (5,)).id])
    p.mark_output(other.outputs[0])
    _refused(p, ids + [other.id], "must follow")
    q, qids = conv_program("conv1d", (2, 3, 8), (4, 3, 3), epilogue=[("add", {}, [(3, 2, 4, 6)])])
    _refused(q, qids, "is not the size of the convolution's output")


def test_refuses_empty_tensors():
    p, ids = conv_program("conv2d", (0, 2, 5, 5), (3, 2, 3, 3))
    _refused(p, ids, "is empty")


def test_refuses_other_padding_modes_and_unresolved_padding():
    p, ids = conv_program("conv2d", (1, 2, 5, 5), (3, 2, 3, 3))
    p.nodes[ids[0]].attrs["padding_mode"] = "reflect"
    _refused(p, ids, "padding_mode 'reflect' is not generated")
    p.nodes[ids[0]].attrs["padding_mode"] = "zeros"
    p.nodes[ids[0]].attrs["padding"] = "full"
    _refused(p, ids, "padding 'full' is not resolved to integers")


def test_refuses_staging_weights_past_the_shared_memory():
    p, ids = conv_program(op="conv2d", x_shape=(1, 1400, 9, 9), w_shape=(4, 1400, 3, 3))   # 50 KB a channel
    _refused(p, ids, "would take more than 48 KB of shared memory", params={"stage_weights": True})
    p, ids = conv_program(op="conv2d", x_shape=(1, 300, 9, 9), w_shape=(8, 300, 3, 3))     # 10.8 KB a channel
    _refused(p, ids, "their staged weights would take more than 48 KB",
             params={"stage_weights": True, "channels_per_thread": 8})


def test_refuses_channels_per_thread_that_does_not_divide():
    p, ids = conv_program("conv2d", (1, 2, 5, 5), (6, 2, 3, 3))
    _refused(p, ids, "channels_per_thread=4 must divide the 6", params={"channels_per_thread": 4})


def test_host_run_catches_a_wrong_kernel(tmp_path):
    """The host check is not vacuous: a kernel whose padding is off by one fails it."""
    p, ids, _ = build("conv2d_s2_g2_odd")
    ks = generate_kernel(p, ids, name="sabotaged", kind="convolution")
    ks.source = re.sub(r"kPH = (\d+)", lambda m: f"kPH = {int(m.group(1)) + 1}", ks.source)
    run, shapes = host_runner(ks, tmp_path)
    shapes.update({v: tuple(p.values[v].shape) for v in ks.outputs})
    assert not verify_region(p, ks.inputs, ks.outputs, run, draws=1, device="cpu").ok


def test_cases_cover_the_brief():
    """Every kind of configuration named in the brief appears among the cases."""
    ops = {CASES[c][0]["op"] for c in CASES}
    assert ops == {f"conv{d}d" for d in (1, 2, 3)} | {f"conv_transpose{d}d" for d in (1, 2, 3)}
    kw = [CASES[c][0] for c in CASES]
    assert any(k.get("groups", 1) > 1 for k in kw) and any(k.get("dilation") for k in kw)
    assert {2, 3} <= {s for k in kw for s in k.get("stride", [1])}
    assert any(k.get("output_padding") for k in kw) and any(k.get("bias") is False for k in kw)
    assert any(math.prod(k["w_shape"][2:]) == 1 for k in kw) and any(k["x_shape"][0] == 1 for k in kw)
    assert any(len(k.get("epilogue", ())) >= 3 for k in kw)
