"""The tile GEMM's sm_90 main loop (codegen/gemm_wgmma.py, params["mma"] = "wgmma"), without a GPU:
each form it takes (linear's [N, K] weight and matmul's [K, N], ragged shapes, a stack of GEMMs, an
implicit-GEMM convolution, row reductions after the epilogue, 64-wide k slices) compiles through NVRTC
for sm_90a with no spills or warnings (ptxas says when it must serialize the wgmma pipeline: a warning);
tiles it cannot take are refused with the reason; the tuner tries its tiles first on sm_90 and never
elsewhere. tests/gpu/test_gemm_wgmma_gpu.py runs the same kernels against torch."""
import pytest

from agent_core.codegen import generate_kernel
from agent_core.codegen.kernel import CodegenError
from agent_core.compiler import compile_kernel, feature_arch
from tests.test_gemm_conv import conv_program
from tests.test_gemm_epilogue import batched_program, program
from tests.test_gemm_row_reduction import program as rows_program

WG = {"form": "gemm-3xtf32", "mma": "wgmma", "block_m": 128, "warps_m": 8, "warps_n": 1, "block_n": 128,
      "block_k": 32, "stages": 3}
CASES = {
    "one-tile": (lambda: program(64, 8, 32), {"block_m": 64, "warps_m": 4, "block_n": 8, "stages": 2}),  # 1 product chain
    "linear-ragged": (lambda: program(300, 260, 72, op="linear"), {}),
    "matmul-KN": (lambda: program(100, 72, 37, op="matmul", bias=False), {"block_n": 64}),
    "linear-k64-64rows": (lambda: program(256, 192, 128), {"block_m": 64, "warps_m": 4, "block_n": 64, "block_k": 64, "stages": 3}),
    "linear-k-ragged-staged": (lambda: program(150, 100, 45), {"block_n": 64}),   # K % 4: B staged, split out of place
    "bmm": (lambda: batched_program((3, 137, 70), (3, 70, 145), "bmm"), {}),
    "conv2d-thin": (lambda: conv_program((4, 8, 20, 20), 16, (3, 3), padding=1), {"block_n": 16}),
    "rows-logsumexp": (lambda: rows_program(200, 300, 64, ["logsumexp"]), {}),
    "256-cols-plain-sums": (lambda: program(130, 300, 96), {"block_n": 256, "slice_acc": False}),
}


def _kernel(case):
    make, params = CASES[case]
    p = make()
    return generate_kernel(p, list(p.nodes), name="wg", params={**WG, **params})


@pytest.mark.parametrize("case", list(CASES))
def test_each_form_compiles_for_sm90a_without_spills_or_warnings(case):
    ks = _kernel(case)
    assert "wgmma.mma_async.sync.aligned.m64n" in ks.source and "wgmma" in ks.schedule
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.spill_loads == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln.lower()] == [], c.log


@pytest.mark.parametrize("case,in_place", [("linear-ragged", True), ("conv2d-thin", True),
                                           ("linear-k-ragged-staged", False), ("matmul-KN", False)])
def test_b_is_copied_straight_into_the_swizzled_layout_where_16_byte_copies_can(case, in_place):
    """k contiguous with rows 16-byte aligned: cp.async into the swizzled slice, hi split in place; else
    a padded staging tile split into separate hi / lo slices."""
    ks = _kernel(case)
    assert ("float* Bl = Bw + kStages * kBTile;" in ks.source) == in_place


def test_wgmma_sources_build_for_the_arch_specific_target_only():
    assert feature_arch("... wgmma.mma_async ...", "sm_90") == "sm_90a"
    assert feature_arch("... mma.sync ...", "sm_90") == "sm_90"
    assert feature_arch("... wgmma.mma_async ...", "sm_80") == "sm_80"


@pytest.mark.parametrize("params,words", [({"warps_n": 2, "warps_m": 4}, "warpgroups of 4 warps"),
                                          ({"block_m": 96, "warps_m": 6}, "warpgroups of 4 warps"),
                                          ({"block_n": 264}, "multiple of 8 up to 256"),
                                          ({"block_k": 16}, "128-byte rows")])
def test_tiles_the_wgmma_loop_cannot_take_are_refused_with_the_reason(params, words):
    p = program(256, 192, 128)
    with pytest.raises(CodegenError, match=words):
        generate_kernel(p, list(p.nodes), name="wg", params={**WG, **params})


@pytest.mark.parametrize("case", list(CASES))
def test_each_form_matches_torch_in_the_cpu_emulator(case):
    """The same kernel body with wgmma_tf32 in plain C++ (gemm_wgmma.portable_helpers: B read through the
    descriptor and the 128-byte swizzle as the hardware reads it): the split writes, descriptors,
    fragment layouts, pipeline and epilogue agree with torch."""
    import torch
    from tests.test_gemm_row_reduction import emulate
    make, params = CASES[case]
    ks, pairs, _ = emulate(make(), {**WG, **params}, draws=2)
    assert "wgmma" in ks.schedule
    for got, want in pairs:
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_the_tuner_tries_the_wgmma_tiles_first_on_sm90_and_never_elsewhere(monkeypatch):
    from agent_core.agent.tune import tune_space
    from agent_core.codegen import gemm_wgmma
    monkeypatch.setattr(gemm_wgmma, "IN_TUNER", True)
    p = program(2048, 1024, 512)
    ks = generate_kernel(p, list(p.nodes), name="wg", params={"form": "gemm-3xtf32"})
    hopper, ampere = tune_space(ks, arch="sm_90"), tune_space(ks, arch="sm_80")
    assert hopper[0].get("mma") == "wgmma" and not any(v.get("mma") for v in ampere)
    for v in hopper:        # every variant builds
        generate_kernel(p, list(p.nodes), name="wg", params=v)


def test_the_agents_reason_names_the_instruction_the_kept_kernel_runs():
    from agent_core.agent.gemm_form import words
    p = program(256, 192, 128)
    assert "wgmma m64n128k8" in words(_kernel("linear-ragged"))
    assert "mma.sync m16n8k8" in words(generate_kernel(p, list(p.nodes), name="mma", params={"form": "gemm-3xtf32"}))


@pytest.mark.parametrize("args,outputs", [([], 512), (["--n", "128", "--k", "64"], 8192), (["--staged", "--n", "16"], 1024)])
def test_the_probe_tool_reads_every_element_where_the_emulator_does(args, outputs):
    """tools/wgmma_probe.py, run as a shell would with --cpu: the emulator reads each operand element
    where the kernel means it to, so both probes report every output right and the tool exits 0."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "tools" / "wgmma_probe.py"), "--cpu", *args],
                       capture_output=True, text=True, timeout=300, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"B probe: {outputs} of {outputs} outputs" in r.stdout and f"A probe: {outputs} of {outputs}" in r.stdout
