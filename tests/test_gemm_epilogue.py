"""The tile GEMM with its epilogue fused (codegen/gemm_mma.py): variants compile through NVRTC for sm_90
without warnings or spills; the same kernel body with plain-C++ tensor-core helpers runs in the CPU
emulator and matches torch on ragged shapes (linear and matmul, bias or not, and stacks of GEMMs: bmm,
batched matmul, one A broadcast to every GEMM); the planner names the form and `optimize --cpu` compiles it
among the tuning variants."""
from __future__ import annotations

import numpy as np
import pytest

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import cli, emulated

torch = pytest.importorskip("torch")


def program(M, N, K, op="linear", bias=True, seed=0):
    p = Program("gemm_epi")
    x = p.add_input("x", (M, K))
    rng = np.random.default_rng(seed)
    # drawn as torch's layers initialise them (uniform in +-1/sqrt(K)): with unit weights a K = 8192
    # product is ~90 and any two fp32 summation orders already differ by ~1e-4 there
    bound = 1 / np.sqrt(K)

    def init(shape):
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)
    if op == "linear":
        w = p.add_parameter("w", init((N, K)))
        ins = [x.id, w.id]
        if bias:
            ins.append(p.add_parameter("b", init(N)).id)
        y = p.add_node("linear", ins).outputs[0]
    else:
        y = p.add_node("matmul", [x.id, p.add_parameter("w", init((K, N))).id]).outputs[0]
    r = p.add_node("relu", [y]).outputs[0]
    s = p.add_parameter("s", rng.standard_normal(N).astype(np.float32))
    m = p.add_node("mul", [r, s.id]).outputs[0]
    p.mark_output(p.add_node("tanh", [m]).outputs[0])
    return p


@pytest.mark.parametrize("shape,op,params", [((256, 192, 128), "linear", {}),
                                             ((100, 70, 37), "matmul", {"block_k": 16, "stages": 4}),
                                             ((300, 260, 64), "linear", {"block_m": 128, "block_n": 128,
                                                                         "warps_m": 2, "warps_n": 4})])
def test_compiles_for_sm90_without_warnings_or_spills(shape, op, params):
    p = program(*shape, op=op)
    ks = generate_kernel(p, list(p.nodes), name="gemm_epi", params={"form": "gemm-3xtf32", **params})
    assert ks.kind == "gemm" and "mma.sync.aligned.m16n8k8" in ks.source and "cp.async" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []


@pytest.mark.parametrize("shape,op,bias,params", [((70, 50, 44), "linear", True, {}),
                                                  ((33, 20, 13), "matmul", False, {}),
                                                  ((70, 50, 44), "matmul", False, {"block_k": 16, "stages": 4}),
                                                  ((130, 72, 40), "linear", False, {"block_m": 128, "block_n": 64})])
def test_emulated_kernel_matches_torch_on_ragged_shapes(shape, op, bias, params):
    p = program(*shape, op=op, bias=bias)
    ks = generate_kernel(p, list(p.nodes), name="gemm_emu", params={"form": "gemm-3xtf32", "portable": True, **params})
    for draw in range(2):
        torch.manual_seed(draw)
        got, want = emulated(p, ks, [torch.randn(shape[0], shape[2])])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cli_plans_and_compiles_the_tile_gemm_form(tmp_path):
    src = tmp_path / "lin.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "class Model(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.fc = nn.Linear(200, 136)\n"
                   "    def forward(self, x):\n        return torch.relu(self.fc(x)) * 0.5\n"
                   "def get_inputs(): return [torch.randn(100, 200)]\ndef get_init_inputs(): return []\n")
    assert cli("import", str(src), "-o", str(tmp_path / "lin.json")).returncode == 0
    r = cli("plan", str(tmp_path / "lin.json"))
    assert r.returncode == 0 and "tile-GEMM kernel (gemm-3xtf32)" in r.stdout, r.stdout + r.stderr
    r = cli("optimize", str(tmp_path / "lin.json"), "--cpu", "-o", str(tmp_path / "out"))
    assert r.returncode == 0 and "the tile GEMM form among them" in r.stdout, r.stdout + r.stderr


def test_cli_plans_a_linear_whose_norm_reads_it_through_a_reshape(tmp_path):
    """Swin's linear -> view -> layer_norm: the view is no op to name in the tile-GEMM form's words
    (`stitchcuda plan` of 30_SwinTransformerV2 stopped with an internal IndexError on it)."""
    src = tmp_path / "swin.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "class Model(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.fc, self.norm = nn.Linear(256, 384), nn.LayerNorm(384)\n"
                   "    def forward(self, x):\n        return self.norm(self.fc(x).view(8, 64, 384))\n"
                   "def get_inputs(): return [torch.randn(512, 256)]\ndef get_init_inputs(): return []\n")
    r = cli("plan", str(src))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "its 512 rows normalised (layer_norm) in the kernel" in r.stdout, r.stdout


def batched_program(ash, bsh, op="matmul"):
    """a [..., M, K] @ b [..., K, N] (bmm or a stack matmul) -> relu -> * s (per column)."""
    p = Program("bmm_epi")
    a, b = p.add_input("a", ash), p.add_input("b", bsh)
    y = p.add_node(op, [a.id, b.id]).outputs[0]
    s = p.add_input("s", (p.values[y].shape[-1],))
    p.mark_output(p.add_node("mul", [p.add_node("relu", [y]).outputs[0], s.id]).outputs[0])
    return p


@pytest.mark.parametrize("ash,bsh,op,params", [((3, 37, 20), (3, 20, 45), "bmm", {}),
                                               ((2, 3, 33, 16), (2, 3, 16, 24), "matmul", {"block_k": 16, "stages": 4}),
                                               ((33, 16), (4, 16, 24), "matmul", {})],   # one A for every GEMM
                         ids=["bmm", "stack", "broadcast_a"])
def test_a_stack_of_gemms_runs_one_per_grid_z_and_matches_torch_emulated(ash, bsh, op, params):
    p = batched_program(ash, bsh, op)
    ks = generate_kernel(p, list(p.nodes), name="bmm_emu", params={"form": "gemm-3xtf32", "portable": True, **params})
    assert ks.grid[2] == np.prod(p.values[p.outputs[0]].shape[:-2]) and "GEMMs along grid z" in ks.schedule
    # the kernel is named for its region (it once took the batch pointer's name, so two stacks collided)
    assert ks.name.endswith("bmm_emu") and "Region bmm_emu:" in ks.source
    for draw in range(2):
        torch.manual_seed(draw)
        got, want = emulated(p, ks, [torch.randn(p.values[v].shape) for v in p.inputs])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_stack_of_gemms_compiles_for_sm90_and_a_partly_broadcast_batch_is_refused():
    from agent_core.codegen import CodegenError
    p = batched_program((16, 12, 512, 64), (16, 12, 64, 512))     # attention-sized scores, then relu * s
    c = compile_kernel(generate_kernel(p, list(p.nodes), name="bmm_c", params={"form": "gemm-3xtf32"}), arch="sm_90")
    assert c.spill_stores == 0 and [ln for ln in c.log.splitlines() if "warning" in ln] == []
    partly = batched_program((2, 1, 8, 16), (2, 3, 16, 8))
    with pytest.raises(CodegenError, match="hold every batch of the output or one matrix"):
        generate_kernel(partly, list(partly.nodes), name="bmm_p", params={"form": "gemm-3xtf32"})


def test_one_tf32_product_is_a_form_only_where_the_program_allows_it():
    """params tf32: a_hi b_hi alone (plain TF32): in the emulator within TF32's rounding of torch
    (a few 1e-3 at K = 300) and not within 1e-4, so it really drops the lo products; among the tuner's
    forms (alternatives) only once the program allows TF32, and refused on the TMA loop."""
    from agent_core.codegen import CodegenError
    from agent_core.codegen.gemm_mma import alternatives
    from agent_core.codegen.region_io import region_io
    p = program(70, 50, 300)
    ks = generate_kernel(p, list(p.nodes), name="gemm_tf32", params={"form": "gemm-3xtf32", "portable": True,
                                                                     "tf32": True})
    assert "mma_tf32(sacc" in ks.source and "TF32 mma.sync" in ks.schedule
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(70, 300)])
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    assert not torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    io = region_io(p, list(p.nodes))
    assert not any(a.get("tf32") for a in alternatives(p, io))
    p.metadata["allow_precision"] = ["tf32"]
    assert [a for a in alternatives(p, io) if a.get("tf32")] == [{"form": "gemm-3xtf32", "block_n": 64, "tf32": True}]
    c = compile_kernel(generate_kernel(p, list(p.nodes), name="gemm_tf32", params={"form": "gemm-3xtf32", "tf32": True}),
                       arch="sm_90")
    assert c.spill_stores == 0
    with pytest.raises(CodegenError, match="one-TF32-product form"):
        generate_kernel(p, list(p.nodes), name="g", params={"form": "gemm-3xtf32", "mma": "tma", "block_m": 128,
                                                            "warps_m": 8, "warps_n": 1, "block_n": 128, "block_k": 32,
                                                            "stages": 3, "tf32": True})


def test_tiles_in_groups_of_m_tiles_cover_every_output_tile_once():
    """The grouped tile order (gemm_mma.GROUPED_TILE): 19 M tiles are two whole groups of 8 and a last
    group of 3, walked down each of 3 N tiles; every output tile is computed, each by one CTA."""
    from agent_core.codegen.gemm_mma import GROUP_M
    p = program(300, 40, 24, bias=True)
    params = {"block_m": 16, "warps_m": 1, "block_n": 16, "warps_n": 2}
    ks = generate_kernel(p, list(p.nodes), name="gemm_groups", params={"form": "gemm-3xtf32", "portable": True, **params})
    assert ks.grid[:2] == (3, 19) and 19 % GROUP_M and "in_group = kGroupM * gridDim.x" in ks.source
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(300, 24)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
