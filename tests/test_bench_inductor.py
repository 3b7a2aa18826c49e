"""`stitchcuda bench --compile-modes`: the torch.compile modes a run times (max-autotune opt-in), each
mode's time or the reason it has none, and the kernels Inductor generated per mode next to ours, in the
printed table, the JSON lines and tools/bench_merge.py's markdown."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from agent_core.commands import bench
from agent_core.profile.baselines import measure_baselines
from agent_core.profile.inductor_kernels import count_kernels

ROOT = os.path.join(os.path.dirname(__file__), "..")

# The wrapper Inductor (torch 2.11) writes for a linear + GELU + residual and a softmax on CUDA, in its
# format: kernels defined through async_compile.triton with their source in ''' ''', launched from
# call() with .run(...), one of them twice (Inductor reuses a definition for identical loops), the
# matmul an extern cuBLAS call, one aten fallback, and comments naming ATen ops that are not calls.
CUDA_WRAPPER = textwrap.dedent('''
    # AOT ID: ['0_inference']
    from ctypes import c_void_p, c_long, c_int
    import torch
    from torch._inductor.select_algorithm import extern_kernels
    from torch._inductor.runtime.triton_heuristics import grid, split_scan_grid
    aten = torch.ops.aten
    assert_size_stride = torch._C._dynamo.guards.assert_size_stride
    empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
    reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
    alloc_from_pool = torch.ops.inductor._alloc_from_pool
    async_compile = AsyncCompile()


    # kernel path: /tmp/torchinductor_root/3k/c3kx.py
    # Topologically Sorted Source Nodes: [linear, gelu, add], Original ATen: [aten.addmm, aten.gelu, aten.add]
    # Source node to ATen node mapping:
    #   add => add
    #   gelu => add_1, erf, mul, mul_1, mul_2
    triton_poi_fused_add_addmm_gelu_0 = async_compile.triton('triton_poi_fused_add_addmm_gelu_0', \'\'\'
    import triton
    import triton.language as tl
    from torch._inductor.runtime import triton_helpers, triton_heuristics

    @triton_heuristics.pointwise(size_hints={'x': 1024}, filename=__file__,
        triton_meta={'signature': {'in_out_ptr0': '*fp32', 'in_ptr0': '*fp32', 'xnumel': 'i32'}},
        min_elem_per_thread=0)
    @triton.jit
    def triton_poi_fused_add_addmm_gelu_0(in_out_ptr0, in_ptr0, in_ptr1, xnumel, XBLOCK : tl.constexpr):
        xnumel = 1024
        xoffset = tl.program_id(0) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)[:]
        xmask = xindex < xnumel
        x2 = xindex
        tmp0 = tl.load(in_out_ptr0 + (x2), xmask)
        tmp1 = tl.load(in_ptr0 + (x0), xmask, eviction_policy='evict_last')
        tmp2 = tmp0 + tmp1
        tmp3 = libdevice.erf(tmp2 * 0.7071067811865476)
        tl.store(in_out_ptr0 + (x2), tmp2 * 0.5 * (tmp3 + 1.0) + tl.load(in_ptr1 + (x2), xmask), xmask)
    \'\'\', device_str='cuda')


    # kernel path: /tmp/torchinductor_root/qq/cqqz.py
    # Topologically Sorted Source Nodes: [softmax], Original ATen: [aten._softmax]
    triton_per_fused__softmax_1 = async_compile.triton('triton_per_fused__softmax_1', \'\'\'
    import triton
    import triton.language as tl

    @triton_heuristics.persistent_reduction(size_hints={'x': 64, 'r0_': 64}, reduction_hint=ReductionHint.INNER)
    @triton.jit
    def triton_per_fused__softmax_1(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK : tl.constexpr):
        # extern_kernels.mm(...) in a comment inside a kernel's source is not a call
        tmp0 = tl.load(in_ptr0 + (r0_1 + 64*x0), xmask, other=0.0)
        tmp4 = triton_helpers.max2(tmp0, 1)[:, None]
        tl.store(out_ptr2 + (r0_1 + 64*x0), tl.exp(tmp0 - tmp4) / tl.sum(tl.exp(tmp0 - tmp4), 1)[:, None], xmask)
    \'\'\', device_str='cuda')


    async_compile.wait(globals())
    del async_compile

    def call(args):
        arg0_1, arg1_1, arg2_1, arg3_1 = args
        args.clear()
        assert_size_stride(arg0_1, (64, 16), (16, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((64, 16), (16, 1), torch.float32)
            # Topologically Sorted Source Nodes: [linear], Original ATen: [aten.addmm]
            extern_kernels.mm(arg2_1, reinterpret_tensor(arg0_1, (16, 16), (1, 16), 0), out=buf0)
            del arg0_1
            buf1 = buf0; del buf0  # reuse
            # Topologically Sorted Source Nodes: [linear, gelu, add], Original ATen: [aten.addmm, aten.gelu, aten.add]
            stream0 = get_raw_stream(0)
            triton_poi_fused_add_addmm_gelu_0.run(buf1, arg1_1, arg2_1, 1024, grid=grid(1024), stream=stream0)
            buf2 = empty_strided_cuda((64, 16), (16, 1), torch.float32)
            extern_kernels.mm(buf1, reinterpret_tensor(arg3_1, (16, 16), (1, 16), 0), out=buf2)
            buf3 = buf2; del buf2  # reuse
            triton_poi_fused_add_addmm_gelu_0.run(buf3, arg1_1, buf1, 1024, grid=grid(1024), stream=stream0)
            buf4 = torch.ops.aten.cumsum.default(buf3, 1)
            buf5 = alloc_from_pool(buf4, 0, torch.float32, (64, 16), (16, 1))
            triton_per_fused__softmax_1.run(buf4, buf5, 64, 16, grid=grid(64), stream=stream0)
        return (buf5, )


    def benchmark_compiled_module(times=10, repeat=10):
        from torch._dynamo.testing import rand_strided
        from torch._inductor.utils import print_performance
        arg0_1 = rand_strided((16, 16), (16, 1), device='cuda:0', dtype=torch.float32)
        fn = lambda: call([arg0_1, arg1_1, arg2_1, arg3_1])
        return print_performance(fn, times=times, repeat=repeat)


    if __name__ == "__main__":
        from torch._inductor.wrapper_benchmark import compiled_module_main
        compiled_module_main('None', benchmark_compiled_module)
''')


def test_kernel_counter_counts_launches_of_generated_kernels_and_extern_calls_in_a_cuda_wrapper():
    assert count_kernels([CUDA_WRAPPER]) == {"generated": 3, "extern": 3}
    # a graph break gives two wrappers: their kernels add up
    assert count_kernels([CUDA_WRAPPER, CUDA_WRAPPER]) == {"generated": 6, "extern": 6}


def test_kernel_counter_refuses_what_it_cannot_read_rather_than_counting_zero():
    with pytest.raises(ValueError, match="no output code"):
        count_kernels([])
    with pytest.raises(ValueError, match="not its Python wrapper"):
        count_kernels(['#include "cpp_wrapper.h"\nvoid inductor_entry_impl(AtenTensorHandle* input_handles) {}'])


def _write_block(tmp_path):
    path = tmp_path / "tiny_linear_gelu.py"
    path.write_text(textwrap.dedent('''
        """A linear, GELU and a residual add, small enough for the CPU."""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(16, 16)

            def forward(self, x):
                return torch.nn.functional.gelu(self.fc(x)) + x


        def get_inputs():
            return [torch.randn(8, 16)]


        def get_init_inputs():
            return []
    '''))
    return path


def _bench(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "agent_core.cli", "bench", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_bench_times_each_asked_mode_and_records_inductors_kernel_counts_on_the_cpu(tmp_path):
    block = _write_block(tmp_path)
    program = tmp_path / "tiny_linear_gelu.json"      # the same block as a program file: its ops through torch
    imp = subprocess.run([sys.executable, "-m", "agent_core.cli", "import", str(block), "-o", str(program)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert imp.returncode == 0, imp.stderr
    out = tmp_path / "b.jsonl"
    proc = _bench(str(block), str(program), "--cpu", "--no-tune", "--trials", "3",
                  "--compile-modes", "default,max-autotune-no-cudagraphs", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["problem"] for r in recs] == ["tiny_linear_gelu", "tiny_linear_gelu"]
    for rec in recs:
        assert rec["ok"] and rec["baseline_device"] == "cpu", rec
        assert list(rec["compile_ms"]) == ["default", "max-autotune-no-cudagraphs"]
        for mode, ms in rec["compile_ms"].items():
            assert ms or (rec.get("compile_errors") or {}).get(mode), f"{mode}: neither a time nor a reason"
            if ms:
                counts = rec["inductor_kernels"][mode]
                assert counts["generated"] >= 1 and counts["generated"] + counts["extern"] >= 2, counts
        assert rec["inductor_kernels"]["default"]["extern"] >= 1          # the matmul is a library call
        timed = {"eager": rec["eager_ms"], **{f"compile_{m}": v for m, v in rec["compile_ms"].items() if v}}
        assert rec["best_baseline"] == min(timed, key=timed.get) and rec["best_baseline_ms"] == min(timed.values())
        assert rec["inductor_fewest_kernels"] >= 2 and rec["more_kernels_than_inductor"] is None   # no GPU run
    head = next(line for line in proc.stdout.splitlines() if line.startswith("problem"))
    assert "default ms" in head and "m-a-ncg ms" in head and "ours/ind" in head
    assert "timed on the CPU" in proc.stdout


def test_an_unknown_compile_mode_is_a_clear_error_with_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "b.jsonl"
    proc = _bench(str(_write_block(tmp_path)), "--cpu", "--compile-modes", "default,max-autotun",
                  "--json", str(out), timeout=60)
    assert proc.returncode == 2
    assert "unknown torch.compile mode 'max-autotun'" in proc.stderr and "max-autotune" in proc.stderr
    assert not out.exists()


def test_a_mode_over_the_compile_budget_is_recorded_with_its_reason_and_left_out_of_the_best(tmp_path):
    import torch
    x = torch.randn(8, 16)
    base = measure_baselines(lambda t: torch.relu(t) * 2.0, [x], compile_modes=("default", "max-autotune"),
                             trials=2, compile_budget_s=0.0, device="cpu")
    assert base["compile_default"]["ok"] and base["compile_default"]["inductor_kernels"]["generated"] == 1
    assert not base["compile_max-autotune"]["ok"] and "over the compile budget" in base["compile_max-autotune"]["skipped"]

    class Result:
        profile = {"baselines": base, "baseline_device": "cpu"}
        outcomes, gpu, writer = [], False, None
    rec = bench.record_from_result("relu.py", Result, 1.0)
    assert rec["compile_ms"]["max-autotune"] is None and "over the compile budget" in rec["compile_errors"]["max-autotune"]
    assert rec["best_baseline"] in ("eager", "compile_default")
    text = "\n".join(bench.table([rec]))
    assert "relu: torch.compile max-autotune is not in the best baseline: over the compile budget" in text


def test_only_code_still_compiled_is_profiled_for_its_launched_kernels(monkeypatch):
    """torch._dynamo.reset() before each mode drops the earlier modes' code, so a kernel count taken
    after all timings may only call eager and the last mode compiled: called again, an earlier mode
    would compile anew inside the profiler. Run on the CPU with the GPU timer and profiler replaced;
    the count is taken on the very callable that was timed, with no compile in between."""
    import torch

    from agent_core.profile import baselines
    from agent_core.profile.timing import time_cpu
    timed, counted = [], []

    def fake_time_gpu(call, trials):
        timed.append(call)
        return time_cpu(call, trials=1, warmup=0)

    def fake_launched(call):
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        call()
        counted.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames)
        return {"kernels": 1}
    monkeypatch.setattr(baselines, "time_gpu", fake_time_gpu)
    monkeypatch.setattr(baselines, "launched_kernels", fake_launched)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    x = torch.randn(8, 16)
    base = measure_baselines(lambda t: torch.relu(t) * 2.0, [x], compile_modes=("default", "max-autotune-no-cudagraphs"),
                             trials=1, device="cuda")
    assert base["compile_default"]["ok"] and base["compile_max-autotune-no-cudagraphs"]["ok"], base
    assert "launched" in base["eager"] and "launched" in base["compile_max-autotune-no-cudagraphs"]
    assert "launched" not in base["compile_default"]
    assert counted == [0, 0], counted      # no compile inside a count


def _timed(name, launches, inductor, ours=1.0, modes=None):
    modes = modes or {"default": 2.0, "reduce-overhead": 1.5, "max-autotune": 1.2}
    rec = {"problem": name, "ok": True, "correct": True, "gpu": True, "eager_ms": 3.0, "ours_ms": ours,
           "compile_ms": modes, "compile_best_ms": min(v for v in modes.values() if v), "kernels": 1,
           "launches": launches, "inductor_kernels": inductor, "jobs": 1}
    timed = {"eager": 3.0, **{f"compile_{m}": v for m, v in modes.items() if v}}
    rec["best_baseline"] = min(timed, key=timed.get)
    rec["best_baseline_ms"] = timed[rec["best_baseline"]]
    rec.update(bench.kernel_comparison(launches, inductor))
    rec.update(speedup_eager=3.0 / ours, speedup_compile=rec["compile_best_ms"] / ours,
               speedup_best=rec["best_baseline_ms"] / ours)
    return rec


def test_a_row_with_more_kernels_than_inductor_is_flagged_in_the_table():
    few = {"default": {"generated": 2, "extern": 1}, "max-autotune": {"generated": 1, "extern": 0}}
    recs = [_timed("more", 3, few), _timed("fewer", 1, few)]
    assert recs[0]["more_kernels_than_inductor"] and recs[0]["inductor_fewest_kernels"] == 1
    assert recs[1]["more_kernels_than_inductor"] is False
    lines = bench.table(recs)
    row = next(line for line in lines if line.startswith("more "))
    assert "3/1!" in row and "3/1!" not in next(line for line in lines if line.startswith("fewer"))
    assert "more kernels per run than Inductor (ours/ind with !): more" in lines
    assert bench.summary(recs)["geomean_speedup_best"] == pytest.approx(1.2)


def test_bench_merge_shows_each_mode_the_best_baseline_and_the_kernel_counts(tmp_path):
    count = {"default": {"generated": 4, "extern": 1}, "reduce-overhead": {"generated": 4, "extern": 1},
             "max-autotune": {"generated": 2, "extern": 0}}
    a = _timed("1_attention", 3, count, ours=0.5)
    b = _timed("2_norm", 1, {"default": {"generated": 1, "extern": 0}}, ours=0.4,
               modes={"default": 0.8, "reduce-overhead": 0.6, "max-autotune": None})
    b["compile_errors"] = {"max-autotune": "over the compile budget: torch.compile already took 301 s"}
    runs = tmp_path / "blocks.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in (a, b)))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_merge.py"), "--title", "blocks",
                           str(runs)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(line for line in lines if line.startswith("| problem"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    for name in ("default ms", "reduce-overhead ms", "max-autotune ms", "best baseline ms",
                 "x best", "kernels ours / Inductor"):
        assert name in cols, cols
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in lines if line.startswith("| 1_") or line.startswith("| 2_")}
    att, norm = rows["1_attention"], rows["2_norm"]
    assert att[cols.index("max-autotune ms")] == "1.200"
    assert att[cols.index("best baseline ms")] == "1.200 (max-autotune)"
    assert att[cols.index("kernels ours / Inductor")] == "3 / 2 (more than Inductor)"
    assert norm[cols.index("max-autotune ms")] == "not timed"
    assert norm[cols.index("best baseline ms")] == "0.600 (reduce-overhead)"
    assert norm[cols.index("kernels ours / Inductor")] == "1 / 1"
    text = proc.stdout
    assert "vs the best of eager and every torch.compile mode run" in text
    assert "2_norm: max-autotune left out of the best baseline: over the compile budget" in text
    assert "more kernels than Inductor: 1 of 2 rows (1_attention)" in text


def test_launched_kernels_counted_by_the_profiler_decide_the_comparison_where_both_sides_have_them():
    """Inductor's code showed 13 calls for 32_CViT where its fused TransformerEncoderLayer calls
    launch many kernels each; the profiler's counts of both sides replace the code count."""
    code = {"default": {"generated": 4, "extern": 9}}
    by_code = bench.kernel_comparison(46, code)
    assert by_code == {"inductor_fewest_kernels": 13, "more_kernels_than_inductor": True,
                       "kernels_counted": "code", "ours_kernels_counted": 46}
    launched = {"ours": 48, "eager": 140, "default": 95, "reduce-overhead": 97}
    by_profiler = bench.kernel_comparison(46, code, launched)
    assert by_profiler == {"inductor_fewest_kernels": 95, "more_kernels_than_inductor": False,
                           "kernels_counted": "launched", "ours_kernels_counted": 48}
    # eager's count is not Inductor's; without a mode's count the code count stays
    assert bench.kernel_comparison(46, code, {"ours": 48, "eager": 140})["kernels_counted"] == "code"
    rec = _timed("32_cvit", 46, code)
    rec.update(by_profiler)
    row = next(line for line in bench.table([rec]) if line.startswith("32_cvit"))
    assert "48/95" in row and "!" not in row
