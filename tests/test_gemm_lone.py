"""A matmul alone (gemm_mma.lone_gemm): where it is compute-bound in fp32, its region gets the tile GEMM as
its kernel (sm_90's TMA tiles among the tuner's alternatives), to be timed against cuBLAS's call and kept
only where faster, and the plan says so; a memory-bound one stays the library call. On the GPU: the
optimize run of tests/gpu/test_gemm_tma_gpu.py."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import torch

from agent_core.ir import Program
from tests.programs import emulated


def lone_linear(M: int, N: int, K: int) -> Program:
    p = Program("lone_linear")
    x = p.add_input("x", (M, K))
    rng = np.random.default_rng(0)
    w = p.add_parameter("w", rng.uniform(-K ** -0.5, K ** -0.5, (N, K)).astype(np.float32))
    b = p.add_parameter("b", rng.uniform(-K ** -0.5, K ** -0.5, N).astype(np.float32))
    p.mark_output(p.add_node("linear", [x.id, w.id, b.id]).outputs[0])
    return p


def test_a_compute_bound_linear_alone_gets_the_tile_gemm_and_the_plan_says_why():
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.analysis.cost import node_cost
    from agent_core.codegen import generate_kernel
    from agent_core.planner import plan_program
    p = lone_linear(394, 1536, 512)          # a ViT's q, k, v projection at batch 2
    (nid,) = list(p.nodes)
    assert node_cost(p, nid).bound() == "compute" and without_kernel(p, [nid]) is None
    ks = generate_kernel(p, [nid], name="qkv")
    assert ks.kind == "gemm" and not ks.library_nodes and ks.params["form"] == "gemm-3xtf32"
    # sm_90's tiles, timed there: 48 tiles of 128 x 128 leave SMs idle, so K in 2 parts, then K whole
    assert [(a.get("mma"), a["block_n"], a["split_k"]) for a in ks.alternatives] == \
        [("tma", 128, 2), ("tma", 128, 1), ("tma", 64, 1)]
    (region,) = [r for r in plan_program(p).regions if nid in r.nodes]
    assert "runs through cuBLAS" in region.reason and "also times it as our tile GEMM" in region.reason


def test_a_memory_bound_linear_alone_stays_the_library_call():
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.analysis.cost import node_cost
    p = lone_linear(4, 4096, 4096)           # a matrix-vector product: reading the weight is its time
    (nid,) = list(p.nodes)
    assert node_cost(p, nid).bound() == "memory" and without_kernel(p, [nid])[0] == "library"


def test_its_tile_gemm_matches_torch_in_the_cpu_emulator():
    from agent_core.codegen import generate_kernel
    p = lone_linear(150, 200, 256)           # ragged: rows and columns past the tiles
    ks = generate_kernel(p, list(p.nodes), name="lone_emu", params={"form": "gemm-3xtf32", "portable": True,
                                                                    "block_m": 64, "block_n": 64, "warps_m": 2,
                                                                    "warps_n": 2, "split_k": 1})
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(150, 256)])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_optimize_without_a_gpu_says_the_tile_gemm_is_to_be_timed_against_cublas(tmp_path):
    from agent_core.project_file import save_program
    src = tmp_path / "lone.json"
    save_program(lone_linear(394, 1536, 512), src)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "-o", str(out), "--cpu",
                          "--no-baselines"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    regions = json.loads((out / "profile.json").read_text())["regions"]
    (lone,) = [r for r in regions if "tile GEMM" in r.get("reason", "")]
    assert "to be timed against cuBLAS on a GPU" in lone["reason"], lone["reason"]


def test_a_linear_whose_output_is_reshaped_gets_the_tile_gemm_too():
    """linear -> reshape (level 2's 55 reshapes its 128 x 32768 output for a max_pool1d): the view is in
    the linear's region, and the region gets the tile GEMM as its kernel, writing the reshaped value
    (it was left to cuBLAS's fp32 while the plan said the tile GEMM would be timed); in the emulator it
    matches torch."""
    from agent_core.agent.region_kinds import without_kernel
    from agent_core.codegen import generate_kernel
    from agent_core.planner import plan_program
    p = lone_linear(150, 256, 256)
    out = p.outputs[0]
    p.outputs.clear()
    p.mark_output(p.add_node("reshape", [out], {"shape": [150, 1, 256]}).outputs[0])
    (region,) = plan_program(p).active
    assert [p.nodes[n].op for n in region.nodes] == ["linear", "reshape"]
    assert without_kernel(p, region.nodes) is None
    ks = generate_kernel(p, region.nodes, name="lone_view")
    assert ks.kind == "gemm" and ks.params["form"] == "gemm-3xtf32" and ks.outputs == p.outputs
    emu = generate_kernel(p, region.nodes, name="lone_view_emu",
                          params={"form": "gemm-3xtf32", "portable": True, "block_m": 64, "block_n": 64,
                                  "warps_m": 2, "warps_n": 2, "split_k": 1})
    torch.manual_seed(0)
    got, want = emulated(p, emu, [torch.randn(150, 256)])
    assert got.shape == (150, 1, 256) and torch.allclose(got, want, atol=1e-4, rtol=1e-4)
