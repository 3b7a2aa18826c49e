"""The row-reduction schedules and their tuning variants at the sizes the blocks run: which schedule a
row gets, that every variant the tuner tries generates and compiles without local-memory spills,
and the PTX facts the speed rests on (one exp per softmax element, float4 loads of the broadcast
bool mask and of the epilogue's operands, several loads in flight in the online schedule)."""
import json
import os
import re
import subprocess
import sys

import pytest

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from tools.bench_rows import CASES, build
from tests.programs import ptx_of, rms_written_out

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




def count(ptx: str, instr: str) -> int:
    return len(re.findall(rf"^\s*(?:@!?%p\d+\s+)?{re.escape(instr)}\s", ptx, re.M))


def test_causal_softmax_at_full_size_is_one_warp_per_row_kernel_whose_variants_all_build(tmp_path):
    """`optimize` on GPT-2's causal softmax at its real size (no GPU here): one region (div, where
    with the stored bool mask, softmax) -> one kernel, 32 lanes per row, no spills, and every tuning
    variant builds (the bench's two kernels came from bool operands not generating, fixed since)."""
    env = {k: v for k, v in os.environ.items() if k != "STITCHCUDA_BLOCKS_SMALL"}
    out = tmp_path / "cs"
    res = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize",
                          os.path.join(ROOT, "benchmarks/blocks/causal_softmax_gpt2.py"), "-o", str(out)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    plan = next(e for e in events if e["event"] == "plan")
    assert plan["regions"] == 1 and plan["kernels"] == 1
    codegen = [e for e in events if e["event"] == "codegen"]
    assert len(codegen) == 1 and codegen[0]["kind"] == "row_reduction"
    assert codegen[0]["params"]["schedule"] == "warp" and codegen[0]["params"]["threads_per_row"] == 32
    compiled = next(e for e in events if e["event"] == "compile")
    assert compiled["spill_stores"] == 0 and compiled["spill_loads"] == 0
    assert "does not build" not in res.stdout + res.stderr
    assert "tuning variant(s) compiled" in res.stdout


def test_softmax_with_broadcast_mask_keeps_each_exp_and_loads_the_mask_four_bytes_at_a_time(tmp_path):
    p, ids, _ = build("softmax", (8, 12, 1024, 1024), "causal", device="cpu")
    ks = generate_kernel(p, ids, name="causal_1024")
    assert ks.params["schedule"] == "warp" and ks.params["threads_per_row"] == 32
    assert ks.params["rows_per_block"] == 8 and ks.params["vector_width"] == 4
    ptx = ptx_of(ks, tmp_path)
    per_thread = 1024 // 32
    assert count(ptx, "ex2.approx.ftz.f32") == per_thread     # one exp per element, not two
    assert count(ptx, "ld.global.nc.v4.u8") == per_thread // 4   # the bool mask, 4 per access
    assert count(ptx, "ld.global.nc.v4.f32") == per_thread // 4
    assert count(ptx, "ld.global.nc.u8") == 0 and count(ptx, "ld.local.f32") == 0


def test_rms_norm_written_out_reads_its_epilogue_operands_as_float4(tmp_path):
    """Qwen3's QK-norm (x * rsqrt(mean(x^2)) * weight over rows of 128): the epilogue's x and
    weight are read 4 at a time, not one float per element."""
    p, ids = rms_written_out((2, 2048, 32, 128), "qk_norm")
    ks = generate_kernel(p, ids, name="qk_norm")
    assert ks.params["schedule"] == "warp"
    ptx = ptx_of(ks, tmp_path)
    assert count(ptx, "ld.global.nc.f32") == 0, "scalar loads left in the epilogue"


def test_stream_schedule_keeps_several_loads_in_flight(tmp_path):
    p, ids, _ = build("log_softmax", (8, 40000), None, device="cpu")
    ks = generate_kernel(p, ids, name="stream_40000")
    assert ks.params["schedule"] == "stream" and ks.params["unroll"] == 4
    assert "4 loads in flight per thread" in ks.schedule
    ptx = ptx_of(ks, tmp_path)
    assert count(ptx, "ld.global.nc.v4.f32") >= 2 * 4      # pass 1 and pass 2, 4 vectors at a time each
    variants = tune_space(ks)
    assert {"threads_per_row": 512, "sm_count": 132} in variants and {"unroll": 2, "sm_count": 132} in variants
    for params in variants:   # none spills (8 float4s in flight would, in 1024 threads' 64 registers)
        c = compile_kernel(generate_kernel(p, ids, name="stream_40000", params=params), arch="sm_90")
        assert c.spill_stores == 0 and c.stack_bytes == 0, (params, c.summary())


@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
@pytest.mark.parametrize("cols", [1024, 4096, 16384])
def test_warp_and_block_schedules_and_their_variants_compile_without_spills(op, cols):
    mask = "causal" if op == "softmax" else None
    shape = (2, 4, 64, cols) if mask else (256, cols)
    p, ids, _ = build(op, shape, mask, device="cpu")
    ks = generate_kernel(p, ids, name=f"{op}_{cols}")
    assert ks.params["schedule"] == ("warp" if cols <= 1024 else "block")
    variants = tune_space(ks, limit=6)
    assert variants, "no tuning variants"
    for params in [None, *variants]:
        k = ks if params is None else generate_kernel(p, ids, name=f"{op}_{cols}", params=params)
        assert k.params["schedule"] in ("warp", "block")
        c = compile_kernel(k, arch="sm_90")
        assert c.spill_stores == 0 and c.spill_loads == 0 and c.stack_bytes == 0, (params, c.summary())


def test_tuning_variants_of_rows_of_1024_try_rows_per_block_before_a_block_per_row():
    p, ids, _ = build("softmax", (8, 12, 1024, 1024), "causal", device="cpu")
    ks = generate_kernel(p, ids, name="causal_1024")
    variants = [{k: v for k, v in d.items() if k != "sm_count"} for d in tune_space(ks, limit=4)]
    # first the scores loaded everywhere (the causal mask guards their loads: rowguard.py)
    assert variants == [{"guard_loads": False}, {"threads_per_row": 16}, {"block": 512}, {"threads_per_row": 64}]
    assert {"threads_per_row": 8} not in [{k: v for k, v in d.items() if k != "sm_count"}
                                          for d in tune_space(ks, limit=10)]   # 128 floats a thread


@pytest.mark.parametrize("name,op,shape,mask", [c[:4] for c in CASES if c[4]])
def test_bench_rows_quick_cases_generate_and_compile(name, op, shape, mask):
    p, ids, _ = build(op, shape, mask, device="cpu")
    ks = generate_kernel(p, ids, name=name)
    for params in [None, *tune_space(ks, limit=6)]:
        k = ks if params is None else generate_kernel(p, ids, name=name, params=params)
        c = compile_kernel(k, arch="sm_90")
        assert c.spill_stores == 0, (params, c.summary())


def test_bench_rows_help_runs():
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools/bench_rows.py"), "--help"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0 and "--quick" in res.stdout and "% of floor" in res.stdout
