"""The writer's round loop through its Python API, on the CPU: a real HTTP stub server (tests/writer_stub.py)
answers with recorded replies over a socket, the real CPU executor runs each proposal on guarded
buffers in a child process, and the one thing a CPU cannot do, timing on a GPU, is a test double
(DictTimer below). Also the agent loop with a writer: the run finishes whatever the endpoint does,
and without a writer nothing changes."""
import io
import re

import pytest

from agent_core.agent import EventEmitter, optimize, read_events
from agent_core.writer.config import WriterConfig
from agent_core.writer.endpoint import ChatEndpoint, TokenBudget
from agent_core.writer.emulate import CpuExecutor
from agent_core.writer.loop import NOT_TIMED, WriterRun, write_region
from tests.test_agent_mockgpu import mock_gpu  # noqa: F401  (the fixture)
from tests.gpu.test_writer_gpu import ours_without_scans  # noqa: F401  (the fixture)
from tests.writer_cases import KERNEL_NAME, case_program, region_and_ours, reply_text
from tests.writer_stub import StubServer, http_error, malformed, slow, streamed, truncated

OURS_MS = 0.010      # what the double says ours measured (10 us)


class DictTimer:
    """Test double for the GPU timer (there is no GPU here): a dict kernel-name -> ms, the "measured"
    median of any proposal with that entry point. It records what it was asked to time, so a test sees
    that only proposals which passed every check reach it."""

    def __init__(self, times: dict[str, float]):
        self.times, self.timed = times, []

    def __call__(self, ks) -> float:
        self.timed.append(ks)
        return self.times[ks.name]


def _run(responses, *, timer=None, rounds=2, ours_ms=OURS_MS, cancel=None, budget=None, **cfg):
    """write_region on writer_demo's region against a stub replaying `responses`:
    (outcome, events, the requests the stub received)."""
    prog = case_program()
    region, ours = region_and_ours(prog)
    emit = EventEmitter()
    with StubServer(responses) as stub:
        config = WriterConfig(stub.url, "stub", rounds=rounds, retries=0, **cfg)
        out = write_region(prog, region, ours=ours, ours_ms=ours_ms, unfused_ms=0.030, floor_ms=0.001,
                           attribution={"bound": "memory"}, hardware={"name": "test"}, config=config,
                           endpoint=ChatEndpoint(config), budget=budget or TokenBudget(config),
                           executor=CpuExecutor(), timer=timer, emit=emit, cancel=cancel)
    return out, emit.events, stub.requests


def _of(events, name):
    return [e for e in events if e["event"] == name]


def test_compile_error_goes_back_with_its_line_and_the_fix_is_kept_when_faster():
    timer = DictTimer({KERNEL_NAME: 0.004})
    out, events, requests = _run([streamed(reply_text("compile_error")), streamed(reply_text("fixed"))],
                                 timer=timer)
    v1, v2 = _of(events, "writer-verdict")
    assert (v1["round"], v1["ok"], v1["check"]) == (1, False, "compile")
    line = next(i for i, ln in enumerate(reply_text("compile_error").split("```cuda\n")[1].splitlines(), 1)
                if "flaot" in ln)
    assert f"({line}): error" in v1["reason"] and "flaot" in v1["reason"], v1["reason"]
    # round 2's request carries round 1's reply and NVRTC's line as the feedback
    sent = requests[1]["body"]["messages"]
    assert sent[-2]["role"] == "assistant" and "flaot s" in sent[-2]["content"]
    assert sent[-1]["role"] == "user" and "flaot" in sent[-1]["content"] and str(line) in sent[-1]["content"]
    assert _of(events, "writer-request")[1]["messages"] == sent
    assert v2["ok"] and v2["check"] == "passed" and v2["ms"] == 0.004 and v2["ours_ms"] == OURS_MS
    assert v2["kernel"] == KERNEL_NAME and v2["diff"].startswith("--- ours/writer_demo_r1.cu")
    assert len(timer.timed) == 1 and "flaot" not in timer.timed[0].source   # only the checked fix was timed
    assert out.kept and out.round == 2 and out.ms == 0.004 and out.kernel.kind == "writer"
    assert out.reason == "model kernel (stub, round 2) kept: verified on 3 draws, 4.0 us vs ours 10.0 us"
    done = _of(events, "writer-done")[-1]
    assert done["kept"] and done["rounds"] == 2 and done["tokens"] == out.tokens > 0
    kinds = [e["event"] for e in events]
    assert kinds[0] == "writer-request" and kinds[-1] == "writer-done"
    assert kinds.index("writer-reply") < kinds.index("writer-verdict")
    deltas = "".join(e["text"] for e in _of(events, "writer-delta") if e["round"] == 1)
    assert deltas == _of(events, "writer-reply")[0]["text"] == reply_text("compile_error")


def test_the_fix_is_not_kept_when_slower_than_ours():
    timer = DictTimer({KERNEL_NAME: 0.025})
    out, events, _ = _run([streamed(reply_text("compile_error")), streamed(reply_text("fixed"))], timer=timer)
    v2 = _of(events, "writer-verdict")[1]
    assert not v2["ok"] and v2["check"] == "slower"
    assert v2["reason"] == "correct but not faster: 25.0 us vs ours 10.0 us"
    assert not out.kept and out.kernel is None and "slower" in out.reason


@pytest.mark.parametrize("ours_ms", [None, 0.040], ids=["ours-not-generated", "ours-slower-than-the-ops"])
def test_when_ours_fell_back_the_bar_is_the_unfused_ops(ours_ms):
    out, events, _ = _run([streamed(reply_text("good"))], timer=DictTimer({KERNEL_NAME: 0.020}), rounds=1,
                          ours_ms=ours_ms)
    assert out.kept and "20.0 us vs the unfused ops 30.0 us" in out.reason
    assert _of(events, "writer-verdict")[0]["ours_ms"] == 0.030


def test_kept_and_not_improving_ends_the_rounds():
    times = iter([0.006, 0.008])
    out, events, requests = _run([streamed(reply_text("good")), streamed(reply_text("fixed")),
                                  streamed(reply_text("good"))], timer=lambda ks: next(times), rounds=3)
    assert len(requests) == 2 and out.kept and out.round == 1 and out.ms == 0.006
    assert "not faster than round 1's 6.0 us" in _of(events, "writer-verdict")[1]["reason"]


def test_without_a_gpu_a_verified_proposal_is_not_kept():
    out, events, requests = _run([streamed(reply_text("good")), streamed(reply_text("good"))], timer=None)
    assert len(requests) == 1           # nothing to improve on without timings
    (v,) = _of(events, "writer-verdict")
    assert v["ok"] and v["ms"] is None and "CPU emulation" in v["reason"]
    assert not out.kept and out.reason == NOT_TIMED


# each hostile reply is rejected by the check named, before any timing
HOSTILE = {"zeros": "constant", "constant": "constant", "caches_first": "global-state", "writes_past": "out-of-bounds",
           "mutates_input": "mutates-input", "other_stream": "stream", "calls_torch": "torch",
           "host_sync": "host-sync", "wrong_name": "format", "no_launch": "format", "truncated": "format"}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_replies_are_rejected_with_their_check(name):
    timer = DictTimer({KERNEL_NAME: 0.001})      # would win if it were ever asked
    out, events, _ = _run([streamed(reply_text(name))], timer=timer, rounds=1)
    (v,) = _of(events, "writer-verdict")
    assert not v["ok"] and v["check"] == HOSTILE[name], v
    assert v["reason"] and not timer.timed and not out.kept
    assert f"rejected ({HOSTILE[name]})" in out.reason


@pytest.mark.parametrize("response, kind", [
    (malformed(b"{not json"), "malformed"),
    (truncated("Here is the kernel:\n```cuda\nextern \"C\" __global__ void"), "truncated"),
    (slow(5.0), "timeout"),
    (http_error(400, {"error": {"message": "prompt too long"}}), "http"),
    (http_error(503, "overloaded"), "http"),
], ids=["malformed", "truncated", "timeout", "http-400", "http-503"])
def test_endpoint_errors_end_the_region_with_the_reason(response, kind):
    out, events, requests = _run([response, streamed(reply_text("good"))], timer=DictTimer({}), rounds=2,
                                 timeout_s=0.5)
    assert len(requests) == 1 and not out.kept and out.stop_run is None    # the run goes on
    assert out.reason.startswith(f"endpoint error ({kind}) in round 1:"), out.reason
    assert not _of(events, "writer-verdict") and _of(events, "writer-done")[0]["reason"] == out.reason


def test_region_token_cap_stops_the_rounds():
    usage = {"prompt_tokens": 900, "completion_tokens": 200}
    out, events, requests = _run([streamed(reply_text("compile_error"), usage=usage),
                                  streamed(reply_text("fixed"), usage=usage)],
                                 timer=DictTimer({KERNEL_NAME: 0.001}), rounds=3, region_token_cap=1000)
    assert len(requests) == 1 and out.tokens == 1100 and not out.kept and out.stop_run is None
    assert "region_token_cap" in out.reason and out.reason.startswith("token cap")


def test_run_token_cap_stops_the_writer_for_the_run():
    usage = {"prompt_tokens": 1500, "completion_tokens": 600}
    prog = case_program()
    region, ours = region_and_ours(prog)
    with StubServer([streamed(reply_text("compile_error"), usage=usage)]) as stub:
        config = WriterConfig(stub.url, "stub", rounds=2, retries=0, run_token_cap=2000)
        emit = EventEmitter()
        run = WriterRun(config, emit, gpu=False, executor=CpuExecutor())
        kw = dict(ours=ours, ours_ms=None, unfused_ms=None, floor_ms=None, attribution={}, hardware={}, timer=None)
        first = run.region(prog, region, **kw)
        second = run.region(prog, region, **kw)      # another region would be asked next: it is not
        assert len(stub.requests) == 1
    assert "run_token_cap" in first.reason and "run_token_cap" in first.stop_run
    assert second.reason.startswith("skipped: the writer stopped for this run") and not second.rounds
    assert run.summary()["tokens"] == 2100 and run.summary()["stopped"] == first.stop_run


def test_cancel_stops_at_once():
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 3          # a few chunks into round 1's reply
    out, events, requests = _run([streamed(reply_text("good"), chunk=8, gap_s=0.01), streamed(reply_text("good"))],
                                 timer=DictTimer({KERNEL_NAME: 0.001}), cancel=cancel)
    assert len(requests) == 1 and out.reason == "cancelled" and out.stop_run == "cancelled" and not out.kept
    assert not _of(events, "writer-verdict") and not _of(events, "writer-reply")


def _optimize(**kw):
    buf = io.StringIO()
    res = optimize(case_program(), device="cpu", emit=EventEmitter(buf), **kw)
    return res, list(read_events(buf.getvalue().splitlines()))


def _without_writer_events(events):
    """The events but the writer's, without what differs between two identical runs (clock, compile cache)."""
    return [{k: v for k, v in e.items() if k not in ("t", "seconds", "cached")} for e in events
            if not e["event"].startswith("writer-")]


def test_the_agent_loop_asks_for_the_compiled_region_and_the_run_finishes_whatever_the_endpoint_does():
    base, base_events = _optimize()
    assert not any(e["event"].startswith("writer-") for e in base_events)
    with StubServer([http_error(500, "boom")]) as stub:
        res, events = _optimize(writer=WriterConfig(stub.url, "stub", rounds=2, retries=0))
        assert len(stub.requests) == 1
    assert events[-1]["event"] == "done" and res.status == "no-gpu"
    done = _of(events, "writer-done")[0]
    assert done["region"] == "r1" and not done["kept"] and "endpoint error (http)" in done["reason"]
    assert re.search(r"500", done["reason"])
    # everything else is what a run without a writer does, event for event
    assert _without_writer_events(events) == _without_writer_events(base_events)
    assert [o.to_dict() for o in res.outcomes] == [o.to_dict() for o in base.outcomes]
    region = res.program.regions[0]
    assert region.log[-1]["actor"] == "writer" and region.log[-1]["action"] == "not kept"
    assert res.writer["regions_kept"] == [] and res.writer["rounds"] == 0
    from agent_core.commands.bench import record_from_result
    assert record_from_result("writer_demo.json", res, 1.0)["writer"] == {
        "model": "stub", "regions_kept": [], "rounds": 0, "tokens": 0}
    assert "writer" not in record_from_result("writer_demo.json", base, 1.0)


def test_writer_regions_selects_which_regions_are_asked():
    with StubServer([streamed(reply_text("good"))]) as stub:
        res, events = _optimize(writer=WriterConfig(stub.url, "stub", rounds=1, retries=0, regions=("r9",)))
        assert not stub.requests
    assert not any(e["event"].startswith("writer-") for e in events)
    assert res.writer["regions"] == {}


def test_the_gpu_tests_fused_cumsum_relu_reply_is_correct_under_emulation():
    """tests/gpu/test_writer_gpu.py keeps this reply on the GPU for a region we do not generate; here
    the same kernel text, launched on 8 rows instead of 8192, passes every check of the gate."""
    from agent_core.agent.loop import kernel_name
    from agent_core.planner import apply_plan, plan_program
    from tests.gpu.test_writer_gpu import cumsum_relu
    prog = cumsum_relu(rows=8)
    apply_plan(prog, plan_program(prog))
    (region,) = [r for r in prog.regions if r.status == "user-made"]
    text = reply_text("gpu_cumsum_relu").replace('"grid": [8192', '"grid": [8')
    name = kernel_name(prog, region.id)
    emit = EventEmitter()
    with StubServer([streamed(text)]) as stub:
        config = WriterConfig(stub.url, "stub", rounds=1, retries=0)
        out = write_region(prog, region, ours=None, ours_ms=None, unfused_ms=0.030, floor_ms=None, attribution={},
                           hardware={}, config=config, endpoint=ChatEndpoint(config), budget=TokenBudget(config),
                           executor=CpuExecutor(), timer=DictTimer({name: 0.015}), emit=emit, name=name)
    (v,) = _of(emit.events, "writer-verdict")
    assert v["ok"], v
    assert out.kept and out.reason.endswith("15.0 us vs the unfused ops 30.0 us")
    assert "We have no kernel of our own" in _of(emit.events, "writer-request")[0]["messages"][1]["content"]


def test_on_the_gpu_path_a_faster_proposal_becomes_the_regions_kernel(mock_gpu, tmp_path, ours_without_scans):
    """The agent loop's GPU path with the GPU faked as in test_agent_mockgpu.py (kernels compiled for
    real, launched by a fake that evaluates their nodes, timed at 1 us + 10 us per torch op): ours is
    not generated for the user's cumsum -> relu region (the row graph's scans switched off, as in
    tests/gpu/test_writer_gpu.py), so its unfused ops (two torch ops) are timed;
    the model's kernel passes the gate in the CPU executor, is timed as ours would be, kept, verified
    again in the run, and the end-to-end program runs it."""
    from tests.gpu.test_writer_gpu import cumsum_relu
    buf = io.StringIO()
    emit = EventEmitter(buf)
    text = reply_text("gpu_cumsum_relu").replace('"grid": [8192', '"grid": [8')
    with StubServer([streamed(text)]) as stub:
        run = WriterRun(WriterConfig(stub.url, "stub", rounds=1, retries=0), emit, gpu=True, executor=CpuExecutor())
        res = optimize(cumsum_relu(rows=8), out_dir=tmp_path, emit=emit, tune=False, rewrite=False,
                       baseline_fn=(None, []), writer=run)
    events = list(read_events(buf.getvalue().splitlines()))
    (o,) = res.outcomes
    assert o.status == "fused" and o.kernel == "gpu_cumsum_relu_r1" and o.unfused_ms == pytest.approx(0.021)
    assert o.reason == ("model kernel (stub, round 1) kept: verified on 3 draws, 1.0 us vs the unfused ops 21.0 us; "
                        "verified again on 5 draws in the run"), o.reason
    assert (tmp_path / "kernels" / "gpu_cumsum_relu_r1.model.cu").read_text() == res.program.regions[0].source
    assert [e["candidate"] for e in events if e["event"] == "verify" and e["scope"] == "region"] == \
        ["model kernel (round 1)"]
    assert res.profile["end_to_end"]["correct"] and res.profile["end_to_end"]["generated_kernels"] == 1
    assert res.writer["regions_kept"] == ["r1"]
    from agent_core.commands.bench import record_from_result
    rec = record_from_result("gpu_cumsum_relu.json", res, 1.0)
    assert rec["writer"] == {"model": "stub", "regions_kept": ["r1"], "rounds": 1, "tokens": res.writer["tokens"]}
    assert rec["kernels"] == 1 and rec["writer"]["tokens"] > 0
    log = res.program.regions[0].log
    assert log[-1]["actor"] == "writer" and log[-1]["action"] == "kept"
    assert log[-1]["message"] == "model kernel kept (round 1): 1.0 us vs the unfused ops 21.0 us"


def test_what_the_cpu_emulator_cannot_run_ends_the_rounds_without_blaming_the_model():
    text = reply_text("good").replace("__syncthreads();  // red is reused below",
                                      'asm volatile("bar.sync 0;");  // red is reused below')
    out, events, requests = _run([streamed(text), streamed(reply_text("good"))], timer=None, rounds=2)
    (v,) = _of(events, "writer-verdict")
    assert v["check"] == "unsupported" and not v["ok"] and len(requests) == 1
    assert out.reason.startswith("not checked: ") and out.reason.endswith("(a GPU run can check it); ours kept")


def test_streamed_text_arrives_as_a_few_deltas_a_second():
    text = reply_text("compile_error")
    out, events, _ = _run([streamed(text, chunk=8, gap_s=0.004)], timer=None, rounds=1)
    deltas = _of(events, "writer-delta")
    (reply,) = _of(events, "writer-reply")
    assert "".join(e["text"] for e in deltas) == reply["text"] == text
    assert 1 <= len(deltas) <= 4 * reply["seconds"] + 2 < len(text) / 8, (len(deltas), reply["seconds"])
