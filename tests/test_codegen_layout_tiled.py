"""The tiled schedule of layout kernels (agent_core/codegen/layout_tiled.py): chosen where an input is
read uncoalesced through its view (pixel_shuffle, a channels-last channel shuffle, permutes that move
the last dim) and not where every read is already coalesced (a slice, a cat along dim 0, an NCHW
channel shuffle); the kernels and their tuning variants compile for sm_90 without spills; the agent
keeps a layout kernel that beats what torch pays for the same outputs (the copy of its views), not
just its free view ops; tools/bench_layout.py runs. On the GPU (-m gpu) each tiled kernel matches
torch on 5 draws."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tools.bench_layout import channel_shuffle, detect_decode, permute, pixel_shuffle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TILED = {
    "pixel_shuffle_r2": lambda: pixel_shuffle((2, 12, 9, 17), 2),
    "pixel_shuffle_r2_aligned": lambda: pixel_shuffle((2, 12, 6, 20), 2),     # float4 loads
    "pixel_shuffle_r3": lambda: pixel_shuffle((2, 27, 8, 40), 3),
    "pixel_shuffle_r4": lambda: pixel_shuffle((1, 48, 6, 10), 4),   # the SwinIR block's small shapes
    "channel_shuffle_nhwc": lambda: channel_shuffle((2, 5, 7, 24), 2, channels_last=True),
    "permute_last_dim_short": lambda: permute((3, 3, 20, 36), (0, 2, 3, 1)),
    "permute_last_dim": lambda: permute((2, 64, 7, 9), (0, 2, 3, 1)),
}


def _slice():
    p = Program("slice")
    x = p.add_input("x", [8, 64, 33])
    n = p.add_node("slice", [x.id], {"dim": 1, "start": 3, "end": 40, "step": 1})
    p.mark_output(n.outputs[0])
    return p, [n.id], None


def _cat0():
    p = Program("cat0")
    a, b = p.add_input("a", [4, 16, 9]), p.add_input("b", [6, 16, 9])
    n = p.add_node("cat", [a.id, b.id], {"dim": 0})
    m = p.add_node("relu", [n.outputs[0]])
    p.mark_output(m.outputs[0])
    return p, [n.id, m.id], None


COALESCED = {
    "slice": _slice,
    "cat_dim0": _cat0,
    "channel_shuffle_nchw": lambda: channel_shuffle((2, 24, 5, 7), 2),   # runs of H * W stay contiguous
}


@pytest.mark.parametrize("case", sorted(TILED))
def test_uncoalesced_views_take_tiles_and_compile_without_spills(case):
    p, ids, _ = TILED[case]()
    ks = generate_kernel(p, ids, name=case)
    assert ks.params["tiled"], ks.schedule
    if not case.startswith("permute"):     # one view: the chain's own 32 x 32 transpose (codegen/layout.py)
        assert "through shared memory" in ks.schedule and ks.params["tiled_inputs"]
        assert "staged in shared memory" in ks.source
    for params in [None, *tune_space(ks)]:
        k = ks if params is None else generate_kernel(p, ids, name=case, params=params)
        assert bool(k.params["tiled"]) == (params or {}).get("tiled", True)   # tiled unless the gather variant
        c = compile_kernel(k, arch="sm_90")
        assert c.spill_stores == 0 and c.spill_loads == 0 and c.stack_bytes == 0, (params, c.summary())


def _run_on_host(p, ks, tmp_path):
    """The kernel's own source compiled for the host (tests/test_codegen_conv.py's shim), verified
    against the reference interpreter on 3 draws. A tiled kernel's block is run by one thread that
    walks the whole tile in both loops (their stride kBlock becomes 1), so the loads all land in the
    tile before the stores read it, as __syncthreads() makes them on the GPU; any other kernel runs
    every thread of every block in turn."""
    import ctypes
    import shutil

    import numpy as np
    from agent_core.verify import verify_region
    from tests.test_codegen_conv import HOST_SHIM
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no host C++ compiler")
    tiled = ks.params["tiled"]
    if tiled:
        assert ks.source.count("t += kBlock") == 2
    src = ks.source.replace("t += kBlock", "t += 1")
    n_args = len(ks.inputs) + len(ks.outputs)
    threads = 1 if tiled else ks.block[0]     # untiled: every thread of every block in turn
    driver = (f'\nextern "C" void host_launch(float** args) {{\n'
              f"  gridDim.x = {ks.grid[0]}; blockDim.x = {ks.block[0]};\n"
              f"  for (unsigned b = 0; b < {ks.grid[0]}; ++b) for (unsigned t = 0; t < {threads}; ++t) {{\n"
              f"    blockIdx.x = b; threadIdx.x = t;\n"
              f"    {ks.name}({', '.join(f'args[{i}]' for i in range(n_args))}); }}\n}}\n")
    # a fresh name per build: dlopen hands back a library already loaded from the same path
    stem = f"{ks.name}_{len(list(tmp_path.glob('*.so')))}"
    cpp, lib = tmp_path / f"{stem}.cpp", tmp_path / f"{stem}.so"
    shim = ("#define __shared__\n#define __restrict__\n#define __align__(n) alignas(n)\n"
            "static inline void __syncthreads() {}\nstruct alignas(16) float4 { float x, y, z, w; };\n")
    cpp.write_text(HOST_SHIM + shim + src + driver)
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", str(cpp), "-o", str(lib)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    fn = ctypes.CDLL(str(lib)).host_launch
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def run(ins):
        arrays = [np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32) for t in ins]
        outs = [np.full(p.values[v].shape, np.nan, dtype=np.float32) for v in ks.outputs]
        fn((ctypes.c_void_p * n_args)(*[a.ctypes.data for a in arrays + outs]))
        return [torch.from_numpy(o) for o in outs]
    res = verify_region(p, ks.inputs, ks.outputs, run, draws=3, device="cpu")
    assert res.ok, res.reason


@pytest.mark.parametrize("case", sorted(c for c in TILED if not c.startswith("permute")))
@pytest.mark.parametrize("params", [None, {"tile_elems": 64, "tile_b": 2}])
def test_tiled_kernels_match_the_reference_on_the_host(case, params, tmp_path):
    """Partial tiles at the ends of both dims included (small tiles: several per row)."""
    p, ids, _ = TILED[case]()
    ks = generate_kernel(p, ids, name=case, params=params)
    assert ks.params["tiled"] and ks.params["tiled_inputs"]
    _run_on_host(p, ks, tmp_path)


@pytest.mark.parametrize("case,params", [("pixel_shuffle_r4", {"store_vector": True}),
                                         ("pixel_shuffle_r4", {"store_vector": True, "tile_elems": 32}),
                                         ("pixel_shuffle_r4", {"store_vector": True, "block": 64})])
def test_float4_stores_of_the_tile_match_the_reference_on_the_host(case, params, tmp_path):
    """The float4-store form (a tuning variant where the tile's short side b is a multiple of 4): each
    thread evaluates 4 neighbours along b and stores them at once; partial tiles along a included."""
    p, ids, _ = TILED[case]()
    plain = generate_kernel(p, ids, name=case)
    ks = generate_kernel(p, ids, name=case, params=params)
    assert ks.params["store_vector"] and "float4 stores" in ks.schedule and ks.align == 16
    assert {"store_vector": True} in [{k: v for k, v in o.items() if k == "store_vector"} for o in tune_space(plain)]
    _run_on_host(p, ks, tmp_path)


def test_a_tile_whose_short_side_is_not_a_multiple_of_4_keeps_scalar_stores():
    p, ids, _ = TILED["pixel_shuffle_r2"]()
    ks = generate_kernel(p, ids, name="ps2", params={"store_vector": True})
    assert not ks.params["store_vector"] and "float4 stores" not in ks.schedule
    assert {"store_vector": True} not in tune_space(generate_kernel(p, ids, name="ps2"))


def _chunk_joined(shape):
    """chunk(x, 2, -1) -> (relu(a), b * 2) -> cat: both arms read x at the output's own index."""
    p = Program("chunk_joined")
    x = p.add_input("x", shape)
    ch = p.add_node("chunk", [x.id], {"chunks": 2, "dim": -1})
    a = p.add_node("relu", [ch.outputs[0]])
    b = p.add_node("mul_scalar", [ch.outputs[1]], {"value": 2.0})
    c = p.add_node("cat", [a.outputs[0], b.outputs[0]], {"dim": -1})
    p.mark_output(c.outputs[0])
    return p, [ch.id, a.id, b.id, c.id], None


STAGED = {
    "detect_decode_small": lambda: detect_decode(small=True),
    "chunk_joined_odd": lambda: _chunk_joined((3, 7, 10)),
}


@pytest.mark.parametrize("case", sorted(STAGED))
@pytest.mark.parametrize("params", [None, {"unroll": 8, "block": 128}])
def test_inputs_read_by_several_arms_at_their_own_index_are_loaded_first(case, params, tmp_path):
    p, ids, _ = STAGED[case]()
    ks = generate_kernel(p, ids, name=case, params=params)
    assert ks.params.get("staged") and "loaded before the branches" in ks.source, ks.schedule
    assert ks.params["unroll"] == (params or {}).get("unroll", 4)
    _run_on_host(p, ks, tmp_path)
    for variant in [None, *tune_space(ks)]:
        c = compile_kernel(ks if variant is None else generate_kernel(p, ids, name=case, params=variant),
                           arch="sm_90")
        assert c.spill_stores == 0 and c.stack_bytes == 0, (variant, c.summary())


def test_detect_decode_loads_its_head_before_the_cat_branches(tmp_path):
    """The PTX of the real-size decode: the 4 staged loads of head come first, one after another,
    before the first branch of the cat's arms."""
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    p, ids, _ = detect_decode()
    ks = generate_kernel(p, ids, name="detect_decode")
    cu, ptx = tmp_path / "dd.cu", tmp_path / "dd.ptx"
    cu.write_text(ks.source)
    subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", "-o", str(ptx), str(cu)], check=True)
    ops = [ln.split()[0] for ln in ptx.read_text().splitlines() if ln.strip().startswith(("ld.global", "@%p", "bra"))]
    first_loads = ops[1:5]      # after the grid-stride loop's entry test
    assert first_loads == ["ld.global.nc.f32"] * 4, ops[:8]


def test_aligned_rows_load_float4_into_the_tile_and_others_stay_scalar(tmp_path):
    for case, vec in (("pixel_shuffle_r2_aligned", 4), ("channel_shuffle_nhwc", 4), ("pixel_shuffle_r2", 1),
                      ("pixel_shuffle_r3", 1)):   # rows of 17; a pitch of 11 (mod 32) breaks 16-byte rows
        p, ids, _ = TILED[case]()
        ks = generate_kernel(p, ids, name=case)
        assert ks.params["vector"] == vec and ("reinterpret_cast<const float4*>" in ks.source) == (vec == 4), case
        assert ks.align == (16 if vec == 4 else 4)
    p, ids, _ = TILED["pixel_shuffle_r2_aligned"]()
    import shutil
    if shutil.which("nvcc"):      # 16-byte loads in the PTX, st.shared.v4 into the tile
        cu = tmp_path / "v.cu"
        cu.write_text(generate_kernel(p, ids, name="v").source)
        subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-ptx", "-o", str(tmp_path / "v.ptx"), str(cu)], check=True)
        ptx = (tmp_path / "v.ptx").read_text()
        assert "ld.global.nc.v4" in ptx and "st.shared.v4" in ptx
    assert {"vector": False} in tune_space(generate_kernel(p, ids, name="v"))
    assert generate_kernel(p, ids, name="v", params={"vector": False}).params["vector"] == 1


def test_tile_sizes_are_tunable_and_the_bank_padding_follows_the_short_side():
    p, ids, _ = TILED["pixel_shuffle_r4"]()
    ks = generate_kernel(p, ids, name="ps4")
    assert ks.params["tile"] == [16, 4] and "kPitch = 40" in ks.source    # kA = 10 -> 16; rows 8 banks apart
    p, ids, _ = pixel_shuffle((2, 12, 64, 300), 2)
    ks = generate_kernel(p, ids, name="ps2")
    assert ks.params["tile"] == [512, 2] and "kPitch = 528" in ks.source
    variants = tune_space(ks)
    assert {"tile_elems": 2048} in variants and {"tile_elems": 512} in variants
    # b = 2 floats: a warp's gather reads whole 32-byte sectors, so the untiled gather is timed first
    assert variants[0] == {"tiled": False}
    assert not generate_kernel(p, ids, name="ps2", params=variants[0]).params["tiled"]
    big = generate_kernel(p, ids, name="ps2", params={"tile_elems": 2048, "block": 512})
    assert big.params["tile"] == [512, 2] and big.block == (512, 1, 1)     # kA 300 caps the tile at 512
    small = generate_kernel(p, ids, name="ps2", params={"tile_elems": 512})
    assert small.params["tile"] == [256, 2]


@pytest.mark.parametrize("case", sorted(COALESCED))
def test_coalesced_reads_keep_one_thread_per_output(case):
    p, ids, _ = COALESCED[case]()
    ks = generate_kernel(p, ids, name=case)
    assert not ks.params["tiled"], ks.schedule
    compile_kernel(ks, arch="sm_90")


def test_bench_layout_help_runs():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools/bench_layout.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--quick" in res.stdout and "pixel_shuffle" in res.stdout


# --- the agent's verdict: a layout kernel against what torch pays for the same outputs -------------
def test_a_layout_kernel_faster_than_torchs_copy_is_kept(tmp_path, monkeypatch):
    """ShuffleNet's cat -> view -> transpose -> view with the transpose a region of its own (as the
    planner splits the block at its real size): a free view in torch whose copy the next reshape pays. Timed as a GPU would: a kernel 20 us,
    a torch op 1 us plus 25 us when it writes new memory (a copy). The verdict compares the kernel with
    the transpose plus the copy of its view output (26 us), so both kernels are kept (the transpose's
    had been compared with 1 us and fell back)."""
    import agent_core.profile.timing as timing
    import agent_core.runtime.split_tf32 as split_mod
    from agent_core.agent import EventEmitter, optimize, read_events
    from tests.test_agent_mockgpu import mock_gpu   # the GPU path on the CPU
    cost = {"us": 0.0}
    real_run_node, real_contiguous = split_mod.run_node, torch.Tensor.contiguous

    def storage(t):
        return t.untyped_storage().data_ptr()

    def run_node(program, nid, env, *a, **k):
        before = {storage(env[v]) for v in program.nodes[nid].inputs if v in env}
        res = real_run_node(program, nid, env, *a, **k)
        wrote = any(storage(env[v]) not in before for v in program.nodes[nid].outputs if v in env)
        cost["us"] += 1.0 + (25.0 if wrote else 0.0)
        return res

    def contiguous(t, *a, **k):
        if not t.is_contiguous():
            cost["us"] += 25.0
        return real_contiguous(t, *a, **k)

    def fake_time(fn, *, trials=20, **kw):
        cost["us"] = 0.0
        fn()
        kernel = cost["us"] == 0.0      # a fused kernel runs no torch op
        return timing.summarize([(20.0 if kernel else cost["us"]) * 1e-3] * trials)

    from agent_core.regions import Region
    p, ids, _ = channel_shuffle((2, 24, 5, 7), 2)
    # the transpose alone, as the planner splits the block at its real size (and a user can draw it)
    p.regions.append(Region(id="u1", kind="layout", nodes=[ids[2]], status="user-made"))
    fixture = mock_gpu.__wrapped__(monkeypatch)
    next(fixture)
    monkeypatch.setattr(split_mod, "run_node", run_node)
    monkeypatch.setattr(torch.Tensor, "contiguous", contiguous)
    monkeypatch.setattr(timing, "time_in_graph", lambda fn, **kw: (fake_time(fn, **kw), "graph"))
    buf = io.StringIO()
    res = optimize(p, out_dir=tmp_path, emit=EventEmitter(buf), tune=False, baselines=False, baseline_fn=(None, []),
                   rewrite=False)
    events = list(read_events(buf.getvalue().splitlines()))
    timed = {}
    for o in res.outcomes:
        if o.fused_ms is not None:
            region = next(r for r in res.program.regions if r.id == o.region)
            timed[tuple(res.program.nodes[n].op for n in region.nodes)] = o
    assert ("transpose",) in timed, {k: (o.status, o.reason) for k, o in timed.items()}
    o = timed[("transpose",)]
    assert o.status == "fused", o.reason
    assert o.unfused_ms == pytest.approx(0.026) and o.fused_ms == pytest.approx(0.020)
    assert "copy is counted" in o.reason
    assert not [e for e in events if e["event"] == "fallback"]
    assert res.profile["end_to_end"]["correct"]


# --- on the GPU ------------------------------------------------------------------------------------
GPU_TILED = {
    "pixel_shuffle_r2": lambda: pixel_shuffle((8, 12, 64, 96), 2),
    "pixel_shuffle_r3": lambda: pixel_shuffle((2, 27, 45, 33), 3),
    "pixel_shuffle_r4": lambda: pixel_shuffle((4, 48, 27, 48), 4),
    "channel_shuffle_nhwc": lambda: channel_shuffle((8, 28, 28, 232), 2, channels_last=True),
    "permute_last_dim_short": lambda: permute((4, 3, 50, 61), (0, 2, 3, 1)),
    "permute_0231": lambda: permute((4, 256, 14, 14), (0, 2, 3, 1)),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", sorted(GPU_TILED))
@pytest.mark.parametrize("params", [None, {"tile_elems": 2048, "block": 512}, {"tile_b": 16}])
def test_gpu_tiled_kernels_match_torch(case, params):
    from tests.programs import fused
    p, ids, fn = GPU_TILED[case]()
    r = fused(p, ids, case, params=params)
    assert r.kernel.params["tiled"]
    xs = [torch.randn(p.values[v].shape, device="cuda") for v in p.inputs]
    from agent_core.reference import parameter_tensors
    pt = parameter_tensors(p, "cuda")
    env = dict(zip(p.inputs, xs))
    out = r([env[v] if v in env else pt[v].contiguous() for v in r.inputs])
    torch.testing.assert_close(out[0].reshape(fn(*xs).shape), fn(*xs), atol=1e-6, rtol=1e-6)


GPU_STAGED = {
    "detect_decode_yolov5": lambda: detect_decode(),
    "chunk_joined": lambda: _chunk_joined((64, 197, 390)),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", sorted(GPU_STAGED))
@pytest.mark.parametrize("params", [None, {"unroll": 8}, {"unroll": 1}])
def test_gpu_staged_kernels_match_the_reference(case, params):
    from tests.programs import fused
    p, ids, _ = GPU_STAGED[case]()
    r = fused(p, ids, case, params=params)
    assert r.kernel.params.get("staged")


def test_random_layout_graphs_run_their_tiled_or_staged_kernels_on_the_host(tmp_path):
    """tests/test_codegen_views_gen.py's random graphs of layout and pointwise ops: whichever of these
    schedules one takes, its kernel's own source, run on the host, computes what torch computes."""
    from hypothesis import HealthCheck, given, settings

    from agent_core.codegen.layout_graph import generate_layout_graph
    from agent_core.codegen.region_io import region_io
    from tests.test_codegen_views_gen import layout_graphs
    seen = {"tiled": 0, "staged": 0}

    @settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
    @given(layout_graphs())
    def check(p):
        ks = generate_layout_graph(p, region_io(p, list(p.nodes)), "random_graph", None, "layout")
        kind = "tiled" if ks.params["tiled"] else "staged" if ks.params.get("staged") else None
        if kind is None or any(p.values[v].dtype != "float32" for v in ks.inputs):
            return
        seen[kind] += 1
        _run_on_host(p, ks, tmp_path)
    check()
    assert seen["tiled"], seen      # the random graphs do reach the tiled schedule


def test_nvcc_compiles_tiled_and_staged_kernels_without_warnings(tmp_path):
    import shutil
    if not shutil.which("nvcc"):
        pytest.skip("nvcc is not installed")
    from tests.test_codegen_indexed import NVCC_FLAGS
    for k, (p, ids, _) in enumerate([TILED["pixel_shuffle_r3"](), TILED["channel_shuffle_nhwc"](),
                                     STAGED["detect_decode_small"]()]):
        ks = generate_kernel(p, ids, name=f"nvcc_{k}")
        cu = tmp_path / f"k{k}.cu"
        cu.write_text(ks.source)
        r = subprocess.run(["nvcc", *NVCC_FLAGS, str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        log = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and "warning" not in log, f"{ks.name}:\n{log}"
