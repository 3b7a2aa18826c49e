"""What the model is told: the first messages name every shape, the kernel, the interface and carry our
kernel with its timing; the feedback carries NVRTC's lines, the checks' reasons and the timings. The
interface the prompt states is the one parse_reply demands."""
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import writer_cases as wc  # noqa: E402

from agent_core.compiler import CompileError, compile_kernel  # noqa: E402
from agent_core.writer.gate import CheckReport, Rejected  # noqa: E402
from agent_core.writer.prompt import feedback_message, first_messages  # noqa: E402
from agent_core.writer.proposal import parse_reply  # noqa: E402

HW = {"name": "NVIDIA H200", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 62914560,
      "copy_bandwidth_gbs": 4213.7, "torch": "2.5.1", "driver_version": 12080}
ATTR = {"ms": 0.0042, "bound": "launch", "floor_ms": 0.0012, "pct_of_floor": 29.1, "achieved_gbs": 1230.5,
        "registers": 32, "spill_stores": 0}


@pytest.fixture(scope="module")
def case():
    p = wc.case_program()
    region, ours = wc.region_and_ours(p)
    return p, region, ours


def messages(case, with_ours=True):
    p, region, ours = case
    return first_messages(p, region.nodes, name=wc.KERNEL_NAME, ours=ours if with_ours else None,
                          ours_ms=0.0042 if with_ours else None, floor_ms=0.0012, attribution=ATTR if with_ours else {},
                          hardware=HW)


def test_first_messages_describe_the_region_exactly(case):
    system, user = messages(case)
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    assert f"`{wc.KERNEL_NAME}`" in text
    # the ops, in order, with their attributes and result types, and each op's reference semantics
    lines = text.splitlines()
    ops = [lines.index("softmax = softmax(x, dim=-1)   # float32[32, 200]"),
           lines.index("mul = mul(softmax, w)   # float32[32, 200]"),
           lines.index("add = add(mul, b)   # float32[32, 200]")]
    assert ops == sorted(ops)
    assert "exp(x - max) / sum(exp(x - max)) along dim" in text       # the softmax op's registry doc
    assert "(a * b), with torch broadcasting" in text
    # every input and output: shape, dtype, strides, role
    assert "- x: input 1, float32[32, 200], contiguous strides [200, 1] (elements), activation" in text
    assert "- w: input 2, float32[200], contiguous strides [1] (elements), parameter" in text
    assert "- b: input 3, float32[200], contiguous strides [1] (elements), parameter" in text
    assert "- add: output 1, float32[32, 200], contiguous strides [200, 1] (elements), activation" in text
    # the interface: the exact signature, inputs then outputs
    assert ('extern "C" __global__ void writer_demo_r1(const float* __restrict__ x, const float* __restrict__ w, '
            'const float* __restrict__ b, float* __restrict__ add);') in text
    assert "NVIDIA H200" in text and "sm_count=132" in text and "torch=" not in text
    # the format and the rules are in the system message
    for part in ("```cuda", "```json", '"grid"', '"block"', '"shared_bytes"', "no torch", "streams",
                 "state", "read-only", "atol = rtol = 0.0001"):
        assert part in system["content"], part


def test_our_kernel_and_its_timing_are_the_starting_point(case):
    _, _, ours = case
    text = messages(case)[1]["content"]
    assert "```cuda\n" + ours.source.rstrip() + "\n```" in text
    assert "it runs in 4.2 us" in text and "1.2 us" in text                # our time and the floor
    assert "bound=launch" in text and "pct_of_floor=29.1" in text and "registers=32" in text
    assert ours.schedule in text and "grid [2, 1, 1], block [256, 1, 1]" in text


def test_without_our_kernel_the_prompt_says_so_and_stays_compact(case):
    system, user = messages(case, with_ours=False)
    assert "no kernel of our own" in user["content"] and "```cuda\n" not in user["content"]
    assert len((system["content"] + user["content"]).encode()) < 6 * 1024
    _, _, ours = case
    with_ours = messages(case)
    assert len(with_ours[1]["content"]) - len(ours.source) < 6 * 1024 - len(system["content"])


def test_a_kernel_written_to_the_prompts_signature_is_accepted(case):
    p, region, _ = case
    user = messages(case)[1]["content"]
    sig = next(ln for ln in user.splitlines() if ln.startswith('extern "C"')).rstrip(";")
    body = wc.reply_text("slow").split("```cuda\n")[1].split("```")[0]
    body = re.sub(r'extern "C" __global__ void writer_demo_r1\([^)]*\)', sig, body)
    reply = f"Here it is.\n```cuda\n{body}```\n```json\n{{\"grid\": [1], \"block\": [1]}}\n```\n"
    from agent_core.codegen import region_io
    io = region_io(p, region.nodes)
    ks = parse_reply(reply, name=wc.KERNEL_NAME, inputs=io.inputs, outputs=io.outputs, node_ids=io.nodes,
                     model="m", round=1)
    compile_kernel(ks)
    assert sig in ks.source


def test_compile_errors_go_back_with_their_lines(case):
    p, region, _ = case
    from agent_core.codegen import region_io
    io = region_io(p, region.nodes)
    ks = parse_reply(wc.reply_text("compile_error"), name=wc.KERNEL_NAME, inputs=io.inputs, outputs=io.outputs,
                     node_ids=io.nodes, model="m", round=1)
    with pytest.raises(CompileError) as info:
        compile_kernel(ks, use_cache=False)
    msg = feedback_message(info.value)
    assert msg["role"] == "user"
    assert "does not compile" in msg["content"] and "(34): error" in msg["content"] and "flaot" in msg["content"]
    # the same lines when the loop hands them over as a Rejected("compile")
    lines = "; ".join(ln.strip() for ln in info.value.log.splitlines() if "error" in ln)
    msg = feedback_message(Rejected("compile", lines))["content"]
    assert "(34): error" in msg and "flaot" in msg


def test_rejections_and_timings_are_fed_back():
    msg = feedback_message(Rejected("stream", "line 25: `cudaStream_t side;`: launches ... not allowed"))["content"]
    assert "stream check" in msg and "line 25" in msg and "```json" in msg
    report = CheckReport(False, "state", "draw 1: returned bit for bit what the call before it returned", 0.0, 1)
    assert "state check: draw 1: returned bit for bit" in feedback_message(report)["content"]
    ok = CheckReport(True, "", "", 2.5e-8, 3)
    faster = feedback_message(ok, ms=0.003, ours_ms=0.0042)["content"]
    assert "3 random draws" in faster and "3.0 us" in faster and "4.2 us" in faster and "1.40x faster" in faster
    slower = feedback_message(ok, ms=0.006, ours_ms=0.0042)["content"]
    assert "6.0 us" in slower and "not faster" in slower
    assert "not timed" in feedback_message(ok)["content"]
