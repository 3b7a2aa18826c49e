"""One region's conversation with the model: propose, check, time, feed back, up to N rounds.

Round k: the messages go to the endpoint -> the reply is parsed into a KernelSource (proposal) ->
static checks (gate) -> NVRTC compile (compile errors go back with their lines) -> the dynamic checks
of the gate, run in a child process by the executor -> the timer (GPU only, after the checks passed)
-> the verdict, which becomes round k+1's feedback. The fastest verified proposal is kept only when
it beats ours (or the region's unfused ops when ours fell back); without a timer nothing is kept.

Every step is an event (writer-request, writer-delta, writer-reply, writer-verdict, writer-done:
docs/EVENTS.md). An endpoint failure ends this region's rounds, never the run; a run-wide token cap
or a cancel ends the writer for the run (WriterOutcome.stop_run).
"""
from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Callable

from ..codegen import region_io
from ..codegen.kernel import KernelSource
from ..compiler import CompileError, compile_kernel
from ..errors import StitchError
from .endpoint import ChatEndpoint, EndpointError, TokenBudget
from .gate import Rejected, check_proposal, static_check
from .prompt import feedback_message, first_messages
from .proposal import parse_reply

DELTA_INTERVAL_S = 0.25          # writer-delta events: at most about 4 a second
NOT_TIMED = "verified under CPU emulation; not timed (no GPU), ours kept"


@dataclass
class WriterOutcome:
    kept: bool
    kernel: KernelSource | None
    ms: float | None
    reason: str
    rounds: list[dict] = field(default_factory=list)   # one verdict per round
    tokens: int = 0                                    # prompt + completion tokens this region used
    round: int | None = None                           # the round whose kernel was kept
    ours_ms: float | None = None                       # what a proposal had to beat ...
    against: str = "ours"                              # ... and what that was: "ours" or "the unfused ops"
    stop_run: str | None = None                        # why the writer stops for the whole run (cap, cancel)

    def summary(self) -> dict:
        return {"kept": self.kept, "reason": self.reason, "round": self.round, "ms": self.ms,
                "rounds": len(self.rounds), "tokens": self.tokens}


def us(ms: float | None) -> str:
    return "?" if ms is None else f"{ms * 1e3:.1f} us"


def proposal_diff(ours: KernelSource | None, ks: KernelSource) -> str:
    """The proposal as a unified diff against our kernel (against nothing when we have none)."""
    before = ours.source.splitlines(keepends=True) if ours is not None else []
    return "".join(difflib.unified_diff(before, ks.source.splitlines(keepends=True),
                                        fromfile=f"ours/{ours.filename}" if ours is not None else "/dev/null",
                                        tofile=f"model/{ks.filename}"))


def _emitter(emit) -> Callable:
    """emit may be an agent EventEmitter or a plain callable(event, **fields)."""
    return emit.emit if hasattr(emit, "emit") else emit


class _Deltas:
    """on_delta for the endpoint: streamed text batched into writer-delta events, at most one per
    DELTA_INTERVAL_S (a model streams tens of tokens a second; the studio needs only a few redraws)."""

    def __init__(self, emit, region: str, round_: int, clock=time.monotonic):
        self.emit, self.region, self.round, self.clock = emit, region, round_, clock
        self.pending, self.last = "", clock()

    def __call__(self, text: str) -> None:
        self.pending += text
        if self.clock() - self.last >= DELTA_INTERVAL_S:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.emit("writer-delta", region=self.region, round=self.round, text=self.pending)
            self.pending, self.last = "", self.clock()


def _compile_rejection(exc: CompileError):
    """NVRTC's error lines (all of them, with their line numbers), as the model must read them."""
    lines = [ln.strip() for ln in (exc.log or "").splitlines() if "error" in ln]
    return Rejected(check="compile", reason="; ".join(lines) if lines else str(exc))


def default_executor(gpu: bool):
    """The GPU child where there is a GPU, else the CPU emulator (here, not in executors.py, which
    both import: the package keeps no import cycle)."""
    if gpu:
        from .gpu_exec import GpuExecutor
        return GpuExecutor()
    from .emulate import CpuExecutor
    return CpuExecutor()


def write_region(program, region, *, ours: KernelSource | None, ours_ms: float | None, unfused_ms: float | None,
                 floor_ms: float | None, attribution: dict, hardware: dict, config, endpoint, budget, executor,
                 timer: Callable[[KernelSource], float] | None, emit, sanitize: bool = False,
                 cancel: Callable[[], bool] | None = None, name: str | None = None,
                 draws: int = 3) -> WriterOutcome:
    """Ask config.model for region's kernel, up to config.rounds rounds (module docstring).

    ours / ours_ms: our kernel and its measured time (None when not generated, not verified or not
    timed); unfused_ms: the region's ops through torch. A proposal must beat the faster of the two:
    ours when it was kept, the unfused ops when ours fell back. timer(ks) ->
    median ms of a proposal timed as ours is (None without a GPU). name: the entry point the model
    must write (default: ours' name, so a kept kernel replaces ours under the same name)."""
    send = _emitter(emit)
    rid = region.id
    io = region_io(program, region.nodes)
    name = name or (ours.name if ours is not None else rid)
    timed = [(ms, what) for ms, what in ((ours_ms, "ours"), (unfused_ms, "the unfused ops")) if ms is not None]
    bar, bar_what = min(timed, key=lambda t: t[0]) if timed else (None, "ours")   # what a proposal must beat
    messages = first_messages(program, io.nodes, name=name, ours=ours, ours_ms=ours_ms, floor_ms=floor_ms,
                              attribution=attribution, hardware=hardware)
    out = WriterOutcome(False, None, None, "")
    best: tuple[float, KernelSource, int] | None = None
    verified_untimed = None
    stop = None          # why the rounds ended early

    def done(reason: str) -> WriterOutcome:
        out.tokens, out.ours_ms, out.against = budget.used(rid), bar, bar_what
        if best is not None:
            out.kept, out.ms, out.kernel, out.round = True, best[0], best[1], best[2]
            reason = (f"model kernel ({config.model}, round {best[2]}) kept: verified on {draws} draws, "
                      f"{us(best[0])} vs {bar_what} {us(bar)}")
        out.reason = reason
        send("writer-done", region=rid, kept=out.kept, reason=reason, model=config.model, rounds=len(out.rounds),
             tokens=out.tokens, ms=out.ms, ours_ms=bar)
        return out

    for k in range(1, config.rounds + 1):
        if cancel is not None and cancel():
            out.stop_run = "cancelled"
            return done("cancelled")
        try:
            budget.check(rid)
        except EndpointError as exc:
            if budget.total >= config.run_token_cap:
                out.stop_run = str(exc)
            stop = f"token cap: {exc}"
            break
        send("writer-request", region=rid, round=k, model=config.model, endpoint=config.host(),
             remote=config.is_remote(), messages=messages)
        deltas = _Deltas(send, rid, k)
        try:
            reply = endpoint.complete(messages, on_delta=deltas, cancel=cancel)
        except EndpointError as exc:
            deltas.flush()
            if exc.kind == "cancelled":
                out.stop_run = "cancelled"
                return done("cancelled")
            stop = f"endpoint error ({exc.kind}) in round {k}: {exc}"
            break
        deltas.flush()
        budget.charge(rid, reply)
        send("writer-reply", region=rid, round=k, text=reply.text, prompt_tokens=reply.prompt_tokens,
             completion_tokens=reply.completion_tokens, finish_reason=reply.finish_reason, seconds=reply.seconds)
        messages = messages + [{"role": "assistant", "content": reply.text}]
        verdict, feedback, ks, ms = _judge(program, io, reply.text, k, name=name, model=config.model,
                                           executor=executor, timer=timer, sanitize=sanitize, draws=draws)
        improving = False
        if verdict["ok"] and timer is None:
            verified_untimed = verdict
        elif verdict["ok"]:
            if bar is None:
                verdict.update(ok=False, check="slower", reason=f"{us(ms)}, but {bar_what} were not timed: "
                                                                f"nothing to beat, ours kept")
            elif ms >= bar:
                verdict.update(ok=False, check="slower",
                               reason=f"correct but not faster: {us(ms)} vs {bar_what} {us(bar)}")
            elif best is None or ms < best[0]:
                best, improving = (ms, ks, k), True
                verdict["reason"] = f"verified on {verdict['draws']} draws, {us(ms)} vs {bar_what} {us(bar)}"
            else:
                verdict["reason"] = (f"verified, {us(ms)}: not faster than round {best[2]}'s {us(best[0])} "
                                     f"(kept)")
        out.rounds.append(verdict)
        send("writer-verdict", region=rid, round=k, ms=ms, ours_ms=bar, kernel=ks.name if ks else None,
             diff=proposal_diff(ours, ks) if ks is not None else None, **verdict)
        if verified_untimed is not None:
            break        # without a GPU there is nothing left to improve on
        if verdict["check"] == "unsupported":     # legal CUDA the CPU emulator cannot run: not the model's fault
            stop = f"not checked: {verdict['reason']} (a GPU run can check it); ours kept"
            break
        if best is not None and not improving:
            break        # kept, and this round did not beat it
        if k < config.rounds:
            messages = messages + [feedback_message(feedback, ms=ms, ours_ms=bar)]
    if best is not None:
        return done("")
    if verified_untimed is not None:
        return done(NOT_TIMED)
    if stop:
        return done(stop)
    last = out.rounds[-1] if out.rounds else None
    return done(f"no proposal kept after {len(out.rounds)} round(s)" +
                (f"; the last was rejected ({last['check']}): {last['reason']}" if last else ""))


def _judge(program, io, text: str, k: int, *, name, model, executor, timer, sanitize, draws):
    """One reply -> (verdict fields, what the model is told next, the proposal or None, its ms or None).
    The timer runs only after every check passed in the executor's child process."""
    verdict = {"ok": False, "check": "", "reason": "", "max_abs_err": None, "draws": 0}
    try:
        ks = parse_reply(text, name=name, inputs=io.inputs, outputs=io.outputs, node_ids=io.nodes,
                         model=model, round=k)
    except Rejected as rej:
        verdict.update(check=rej.check, reason=rej.reason)
        return verdict, rej, None, None
    try:
        static_check(ks)
        try:
            compile_kernel(ks)
        except CompileError as exc:
            raise _compile_rejection(exc) from None
    except Rejected as rej:
        verdict.update(check=rej.check, reason=rej.reason)
        return verdict, rej, ks, None
    try:
        report = check_proposal(program, io.nodes, ks, executor, draws=draws, seed=k, sanitize=sanitize)
    except StitchError as exc:        # an executor error the gate did not turn into a report
        rej = Rejected(check=getattr(exc, "check", "fault"), reason=str(exc))
        verdict.update(check=rej.check, reason=rej.reason)
        return verdict, rej, ks, None
    verdict.update(ok=report.ok, check=report.check or ("passed" if report.ok else "mismatch"),
                   reason=report.reason, max_abs_err=report.max_abs_err, draws=report.draws)
    if not report.ok:
        return verdict, report, ks, None
    if timer is None:
        verdict["reason"] = f"verified under CPU emulation on {report.draws} draws; not timed (no GPU)"
        return verdict, report, ks, None
    try:
        ms = float(timer(ks))
    except Exception as exc:   # a kernel that passed the child's checks but cannot run here is rejected
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        verdict.update(ok=False, check="fault", reason=f"timing failed: {type(exc).__name__}: {first}")
        return verdict, Rejected(check="fault", reason=verdict["reason"]), ks, None
    return verdict, report, ks, ms


# our outcomes a model may try to beat: our kernel kept, our kernel not kept (not generated, failed,
# slower than the ops) and, without a GPU, compiled; never a library call alone or a view
ELIGIBLE = ("fused", "fallback", "compiled")


class WriterRun:
    """The writer across one optimize run: one endpoint, one token budget (the run cap), one
    executor, and what each region got. A cancel or the run's token cap stops it for the rest."""

    def __init__(self, config, emit, *, gpu: bool, cancel=None, sanitize: bool = False, endpoint=None,
                 executor=None):
        config.validate()
        self.config, self.send, self.cancel, self.sanitize = config, _emitter(emit), cancel, sanitize
        self.endpoint = endpoint if endpoint is not None else ChatEndpoint(config)
        self.budget = TokenBudget(config)
        self.executor = executor if executor is not None else default_executor(gpu)
        self.stopped: str | None = None
        self.outcomes: dict[str, WriterOutcome] = {}

    def wants(self, rid: str, status: str) -> bool:
        return status in ELIGIBLE and (not self.config.regions or rid in self.config.regions)

    def region(self, program, region, **kw) -> WriterOutcome:
        """write_region with this run's endpoint, budget and executor; a writer bug or a region the
        prompt cannot describe is this region's reason, never the run's failure."""
        if self.stopped:
            out = WriterOutcome(False, None, None, f"skipped: the writer stopped for this run ({self.stopped})")
            self.send("writer-done", region=region.id, kept=False, reason=out.reason, model=self.config.model,
                      rounds=0, tokens=0)
        else:
            try:
                out = write_region(program, region, config=self.config, endpoint=self.endpoint, budget=self.budget,
                                   executor=self.executor, emit=self.send, sanitize=self.sanitize,
                                   cancel=self.cancel, **kw)
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [""])[0]
                what = "writer error" if isinstance(exc, StitchError) else f"writer error {type(exc).__name__}"
                out = WriterOutcome(False, None, None, f"{what}: {first}", tokens=self.budget.used(region.id))
                self.send("writer-done", region=region.id, kept=False, reason=out.reason, model=self.config.model,
                          rounds=0, tokens=out.tokens)
            self.stopped = out.stop_run
        self.outcomes[region.id] = out
        return out

    def summary(self) -> dict:
        """For profile.json and bench records (never the key: config.public() leaves it out)."""
        return {"model": self.config.model, "endpoint": self.config.host(), "remote": self.config.is_remote(),
                "regions_kept": [rid for rid, o in self.outcomes.items() if o.kept],
                "rounds": sum(len(o.rounds) for o in self.outcomes.values()), "tokens": self.budget.total,
                "stopped": self.stopped, "regions": {rid: o.summary() for rid, o in self.outcomes.items()}}
