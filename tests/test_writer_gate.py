"""The writer's gate on the CPU: recorded model replies parsed into our launch interface, the static
checks on each hostile source, and the dynamic checks run through the real CPU emulator (a child
process running the CUDA source on CPU threads) on guarded buffers."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import writer_cases as wc  # noqa: E402

from agent_core.codegen import region_io  # noqa: E402
from agent_core.compiler import CompileError, compile_kernel  # noqa: E402
from agent_core.writer.gate import Rejected, check_proposal, static_check  # noqa: E402
from agent_core.writer.proposal import parse_reply  # noqa: E402

PASSING = ["good", "fixed", "slow"]          # correct kernels (slow: one thread does everything)
DYNAMIC = {"zeros": "constant", "constant": "constant", "caches_first": "state", "caches_near": "state",
           "writes_past": "out-of-bounds", "mutates_input": "mutates-input"}
STATIC = {"caches_first": "global-state", "caches_near": "global-state", "calls_torch": "torch",
          "other_stream": "stream", "host_sync": "host-sync"}
FORMAT = {"wrong_name": ["writer_demo_r1", "softmax_affine_kernel"], "no_launch": ["```json", "0"],
          "truncated": ["cut off"]}


@pytest.fixture(scope="module")
def case():
    p = wc.case_program()
    region, ours = wc.region_and_ours(p)
    return p, region, ours, region_io(p, region.nodes)


@pytest.fixture(scope="module")
def executor():
    from agent_core.writer.emulate import CpuExecutor
    return CpuExecutor()


def parse(case, text, round=1):
    _, _, _, io = case
    return parse_reply(text, name=wc.KERNEL_NAME, inputs=io.inputs, outputs=io.outputs, node_ids=io.nodes,
                       model="test-model", round=round)


def rejected(case, text) -> Rejected:
    with pytest.raises(Rejected) as info:
        static_check(parse(case, text))
    return info.value


# --- parse_reply -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PASSING + ["compile_error"] + sorted(DYNAMIC) + sorted(STATIC))
def test_well_formed_replies_parse_into_our_launch_interface(case, name):
    _, _, ours, io = case
    ks = parse(case, wc.reply_text(name), round=2)
    assert ks.name == ours.name == wc.KERNEL_NAME
    assert ks.kind == "writer" and ks.schedule == "model kernel (test-model, round 2)"
    assert (ks.inputs, ks.outputs, ks.node_ids) == (io.inputs, io.outputs, io.nodes) and ks.workspace == []
    assert "extern \"C\" __global__" in ks.source and "```" not in ks.source
    assert len(ks.grid) == len(ks.block) == 3 and ks.shared_bytes == 0


def test_launch_block_is_read_exactly(case):
    assert parse(case, wc.reply_text("good")).grid == (32, 1, 1)
    assert parse(case, wc.reply_text("good")).block == (128, 1, 1)
    # fixed.md: a ```cpp fence and a trailing // comment after the JSON
    fixed = parse(case, wc.reply_text("fixed"))
    assert (fixed.grid, fixed.block) == ((32, 1, 1), (64, 1, 1))
    short = wc.reply_text("good").replace('{"grid": [32, 1, 1], "block": [128, 1, 1], "shared_bytes": 0}',
                                          '{"grid": [32], "block": [64, 2]}')
    assert (parse(case, short).grid, parse(case, short).block) == ((32, 1, 1), (64, 2, 1))
    writes_past = parse(case, wc.reply_text("writes_past"))
    assert writes_past.grid == (33, 1, 1)


@pytest.mark.parametrize("name", sorted(FORMAT))
def test_malformed_replies_are_rejected_with_what_to_fix(case, name):
    with pytest.raises(Rejected) as info:
        parse(case, wc.reply_text(name))
    assert info.value.check == "format"
    for part in FORMAT[name]:
        assert part in info.value.reason


GOOD_LAUNCH = '{"grid": [32, 1, 1], "block": [128, 1, 1], "shared_bytes": 0}'


@pytest.mark.parametrize("launch, check, says", [
    ('{"grid": [32, 1, 1], "block": [128, 1, 1], "shared_bytes": 0, "stream": 1}', "stream", "our stream"),
    ('{"grid": [32, 1, 1], "block": [128, 1, 1], "workspace": 64}', "format", "'workspace'"),
    ('{"grid": [32, 1, 1], "block": [2048, 1, 1]}', "format", "1..1024"),
    ('{"grid": [32, 1, 1], "block": [64, 32, 1]}', "format", "2048 threads"),
    ('{"grid": [0, 1, 1], "block": [128, 1, 1]}', "format", "outside 1.."),
    ('{"grid": [32, 70000, 1], "block": [128, 1, 1]}', "format", "outside 1..65535"),
    ('{"grid": [32, 1, 1], "block": [128, 1, 1], "shared_bytes": 300000}', "format", "232448"),
    ('{"grid": [32.0, 1, 1], "block": [128, 1, 1]}', "format", "integers"),
    ('{"grid": [32, 1, 1, 1], "block": [128, 1, 1]}', "format", "1 to 3 integers"),
    ('{"block": [128, 1, 1]}', "format", "lacks 'grid'"),
    ('{"grid": [32, 1, 1], "block": [128, 1, 1]', "format", "not valid JSON"),
])
def test_bad_launch_blocks(case, launch, check, says):
    text = wc.reply_text("good").replace(GOOD_LAUNCH, launch)
    with pytest.raises(Rejected) as info:
        parse(case, text)
    assert info.value.check == check and says in info.value.reason, info.value.reason


def test_bad_sources_and_extra_blocks(case):
    good = wc.reply_text("good")
    variants = {
        "one output pointer short": (good.replace(",\n               const float* __restrict__ b, float* "
                                                  "__restrict__ add)", ", const float* __restrict__ b)"),
                                     "format", "exactly 4"),
        "not extern C": (good.replace('extern "C" __global__', "__global__"), "format", 'extern "C"'),
        "a value, not a pointer": (good.replace("const float* __restrict__ w,", "const float w,"), "format",
                                   "not a pointer"),
        "two code blocks": (good.replace("Launch one block per row:", "```cuda\n// a sketch\n```\n"),
                            "format", "2 code blocks"),
        "a python block with torch": (good + "\n```python\nimport torch\ny = torch.softmax(x, -1) * w + b\n```\n",
                                      "torch", "torch"),
        "a shell block": (good + "\n```bash\nnvcc -O3 k.cu\n```\n", "format", "```bash"),
    }
    for what, (text, check, says) in variants.items():
        with pytest.raises(Rejected) as info:
            parse(case, text)
        assert info.value.check == check and says in info.value.reason, (what, info.value.reason)


# --- static_check ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(STATIC))
def test_hostile_sources_are_rejected_by_their_static_check(case, name):
    r = rejected(case, wc.reply_text(name))
    assert r.check == STATIC[name], r
    assert r.reason.startswith("line ") or "PTX" in r.reason


def test_static_check_names_the_line(case):
    r = rejected(case, wc.reply_text("host_sync"))
    assert "line 16" in r.reason and "cudaDeviceSynchronize" in r.reason
    r = rejected(case, wc.reply_text("caches_first"))
    assert "g_ready" in r.reason


@pytest.mark.parametrize("name", PASSING + ["compile_error", "zeros", "constant", "writes_past", "mutates_input"])
def test_plain_kernels_pass_the_static_check(case, name):
    static_check(parse(case, wc.reply_text(name)))


def test_our_own_kernel_passes_the_static_check(case):
    static_check(case[2])


def test_words_in_comments_and_strings_are_not_code(case):
    good = wc.reply_text("good")
    text = good.replace("#define ROWS 32", "// like torch::softmax(x, -1), no cudaDeviceSynchronize() <<<\n"
                                           "/* __device__ int g_calls; cublasSgemm */\n#define ROWS 32")
    text = text.replace("  __shared__ float red[WARPS];",
                        '  __shared__ float red[WARPS];\n  const char* note = "at::Tensor cudaStreamCreate";')
    static_check(parse(case, text))


@pytest.mark.parametrize("snippet, check", [
    ('#include <stdio.h>\n', "format"),
    ('#include "my_helpers.cuh"\n', "format"),
    ('#include <cublas_v2.h>\n', "library"),
    ('#include <cub/block/block_reduce.cuh>\n', "library"),
    ('#include <ATen/ATen.h>\n', "torch"),
    ('__managed__ float g_last;\n', "global-state"),
    ('namespace { __device__ float g_hidden[4]; }\n', "global-state"),
    ('__device__ __forceinline__ float calls() { static int n = 0; return n++; }\n', "global-state"),
    ('__device__ void wait_until(long long t) { while (clock64() < t) {} }\n', "host-sync"),
    ('__device__ void idle() { __nanosleep(1000); }\n', "host-sync"),
    ('__device__ unsigned long long now() { unsigned long long t; '
     'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n', "host-sync"),
    ('__device__ void copy(float* d, const float* s) { cudaMemcpyAsync(d, s, 4, cudaMemcpyDeviceToDevice); }\n',
     "host-sync"),
    ('__device__ void go() { cudaGraphLaunch(0, 0); }\n', "stream"),
])
def test_forbidden_constructs(case, snippet, check):
    text = wc.reply_text("good").replace("#define ROWS 32", snippet + "#define ROWS 32")
    assert rejected(case, text).check == check


def test_allowed_constructs(case):
    allowed = ('#include <cuda_fp16.h>\n__device__ const float kScale[2] = {1.0f, 2.0f};\n'
               '__constant__ float kBias[2];\n__device__ float helper(float v);\n'
               'template <int N> __device__ __forceinline__ float twice(float v) { return N * v; }\n')
    text = wc.reply_text("good").replace("#define ROWS 32", allowed + "#define ROWS 32")
    text = text.replace("__shared__ float red[WARPS];", "static __shared__ float red[WARPS];")
    static_check(parse(case, text))


def test_library_calls_only_in_a_library_region(case):
    text = wc.reply_text("good").replace("#define ROWS 32", "__device__ void f() { cublasSgemm(0); }\n#define ROWS 32")
    ks = parse(case, text)
    with pytest.raises(Rejected) as info:
        static_check(ks)
    assert info.value.check == "library"
    static_check(ks, library_region=True)


def test_nvrtc_rejects_the_typo_and_takes_the_fix(case):
    with pytest.raises(CompileError) as info:
        compile_kernel(parse(case, wc.reply_text("compile_error")), use_cache=False)
    assert info.value.line == 34 and "flaot" in str(info.value)
    for name in PASSING + sorted(DYNAMIC):
        compile_kernel(parse(case, wc.reply_text(name)))   # the dynamic hostiles are valid CUDA


# --- check_proposal through the CPU emulator -----------------------------------------------------------

@pytest.mark.parametrize("name", ["good", "fixed"])
def test_correct_proposals_pass_every_dynamic_check(case, executor, name):
    p, region, _, _ = case
    report = check_proposal(p, region.nodes, parse(case, wc.reply_text(name)), executor)
    assert report.ok and report.check == "" and report.draws == 3, report
    assert report.max_abs_err < 1e-5


@pytest.mark.parametrize("name", sorted(DYNAMIC))
def test_hostile_proposals_are_rejected_by_their_dynamic_check(case, executor, name):
    p, region, _, _ = case
    # two fresh draws and the perturbed call: enough for every trick here (the caches need a second call)
    report = check_proposal(p, region.nodes, parse(case, wc.reply_text(name)), executor, draws=2)
    assert not report.ok and report.check == DYNAMIC[name], report
    expect = {
        "zeros": ["'add' is 0 everywhere", "draw 0"],
        "constant": ["0.005 everywhere", "draw 0"],
        "caches_first": ["draw 1", "state between calls"],   # replays draw 0's output on a fresh draw
        "caches_near": ["perturbation", "state between calls"],   # only the perturbed call repeats
        "writes_past": ["'add'", "800 bytes past its end"],        # one row of 200 floats
        "mutates_input": ["input 'x'", "element 0"],
    }[name]
    for part in expect:
        assert part in report.reason, report.reason


def test_a_wrong_kernel_is_a_mismatch_that_says_where_and_by_how_much(case, executor):
    from agent_core.writer.prompt import feedback_message
    p, region, _, _ = case
    text = wc.reply_text("good").replace("* inv * w[c] + b[c];", "* inv * w[c] + (c == 7 ? 0.0f : b[c]);")
    report = check_proposal(p, region.nodes, parse(case, text), executor, draws=1, seed=5)
    assert not report.ok and report.check == "mismatch"
    assert report.reason.startswith("draw 5: 'add' differs by")
    assert re.search(r"element \d+ = index \[\d+, 7\] of \[32, 200\]: got -?[\d.e-]+, want", report.reason), report.reason
    assert report.max_abs_err > 1e-3
    msg = feedback_message(report)
    assert msg["role"] == "user" and "mismatch" in msg["content"] and report.reason in msg["content"]


def test_an_element_never_written_is_caught_by_the_poison(case, executor):
    p, region, _, _ = case
    text = wc.reply_text("good").replace("for (int c = t; c < COLS; c += THREADS)\n    add[",
                                         "for (int c = t; c < COLS - 1; c += THREADS)\n    add[")
    report = check_proposal(p, region.nodes, parse(case, text), executor, draws=1)
    assert not report.ok and report.check == "non-finite", report
    assert "element 199 of 'add' was never written" in report.reason


def test_an_executor_failure_is_the_reports_check(case, executor):
    p, region, _, _ = case
    text = wc.reply_text("good").replace("  const int row = blockIdx.x;",
                                         "  const int row = blockIdx.x;\n  if (threadIdx.x == 0) add[1 << 30] = 1.0f;")
    report = check_proposal(p, region.nodes, parse(case, text), executor, draws=1)
    assert not report.ok and report.check == "fault" and "SIGSEGV" in report.reason, report
