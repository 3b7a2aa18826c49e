"""Verify a region's generated code against the reference interpreter.

The whole program runs through the reference (torch, CPU) on random draws; the region's external
inputs from that run feed the candidate, and its outputs must match the reference's within the
program's tolerance on every draw: KernelBench's fp32 one (atol = rtol = 1e-4) unless the program sets
its own (program.metadata["tolerance"] = {"atol": ..., "rtol": ...}, `optimize --tolerance`), which
also decides which lower-precision library forms a user allowed may be kept (runtime/low_precision.py).

A float output that misses the fp32 reference gets a second opinion where the caller can recompute it
in float64 (`exact`): it passes when it is within the tolerance of the float64 value widened by twice
the fp32 reference's own worst error there (compare_exact). A sum whose terms cancel (level 2's
14_Gemm_Divide_Sum_Scaling: 8192 products of about 90 summing to 0.69) is off by about 1e-3 in any
fp32 summation order, torch's included; a kernel that is wrong is off by a term, far more.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .errors import StitchError
from .ir import Program
from .reference import parameter_tensors, random_inputs, run_reference
from .text import first_line, says_out_of_memory

ATOL = RTOL = 1e-4
COMPARE_CHUNK = 1 << 24


class VerifyError(StitchError):
    """Generated code disagrees with the reference; the message gives the value, draw and error."""


def tolerance(program: Program) -> tuple[float, float]:
    """(atol, rtol) every result of this program is held to: its metadata's "tolerance", else 1e-4
    each. A malformed entry (a project file is user input) raises ProgramError naming it."""
    from .errors import ProgramError
    entry = program.metadata.get("tolerance")
    if entry is None:
        return ATOL, RTOL
    if not isinstance(entry, dict) or set(entry) - {"atol", "rtol"}:
        raise ProgramError(f"the program's tolerance must be {{\"atol\": number, \"rtol\": number}}, not {entry!r:.80}")
    return tolerance_value("atol", entry.get("atol", ATOL)), tolerance_value("rtol", entry.get("rtol", RTOL))


def tolerance_value(key: str, v) -> float:
    """v as the tolerance's atol or rtol: a number above 0 and below 1, else ProgramError naming it."""
    import math

    from .errors import ProgramError
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v < 1:
        raise ProgramError(f"the program's tolerance {key} must be a number above 0 and below 1, not {v!r:.40}")
    return float(v)


@dataclass
class VerifyResult:
    ok: bool
    draws: int
    max_abs_err: float = 0.0
    max_rel_excess: float = 0.0   # max of |got - want| / (atol + rtol * |want|); <= 1 passes
    reason: str = ""
    per_output: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "draws": self.draws, "max_abs_err": self.max_abs_err,
                "max_rel_excess": self.max_rel_excess, "reason": self.reason}


def region_samples(program: Program, inputs: list[str], outputs: list[str], seed: int):
    """(input tensors, expected output tensors) of a region for one random draw of the program."""
    env = run_reference(program, random_inputs(program, seed), keep=True,
                        params=parameter_tensors(program, "cpu"))
    return [env[v] for v in inputs], [env[v] for v in outputs]


def compare(program: Program, vid: str, got: torch.Tensor, want: torch.Tensor,
            atol: float | None = None, rtol: float | None = None) -> tuple[bool, float, float, str]:
    """(ok, max abs error, max excess over the tolerance, why not); the tolerance is the program's
    unless given."""
    if atol is None or rtol is None:
        atol, rtol = tolerance(program)
    name = program.values[vid].name
    got = got.detach()
    want = want.to(got.device)   # compared where the candidate ran: copying GBs to the host costs seconds
    if got.numel() != want.numel():
        return False, float("inf"), float("inf"), f"'{name}' has shape {list(got.shape)}, want {list(want.shape)}"
    got = got.reshape(want.shape)
    if want.dtype == torch.bool or got.dtype == torch.bool:
        bad = int((got.bool() != want.bool()).sum())
        return bad == 0, float(bad), float(bad), f"'{name}': {bad} boolean element(s) differ" if bad else ""
    if not want.dtype.is_floating_point:  # indices and counts: exactly, a tolerance would pass off-by-ones
        bad = int((got.long() != want.long()).sum())
        return bad == 0, float(bad), float(bad), f"'{name}': {bad} integer element(s) differ" if bad else ""
    g_all, w_all = got.reshape(-1), want.reshape(-1)
    max_abs = max_ex = 0.0
    worst, nan_mismatch = -1, False
    for lo in range(0, g_all.numel(), COMPARE_CHUNK):   # float64 temporaries of bounded size
        g = g_all[lo:lo + COMPARE_CHUNK].double()
        w = w_all[lo:lo + COMPARE_CHUNK].double()
        nan_mismatch |= bool((torch.isnan(g) != torch.isnan(w)).any())
        diff = torch.where(torch.isnan(w), torch.zeros_like(w), (g - w).abs())
        diff = torch.where(torch.isinf(w) & (g == w), torch.zeros_like(w), diff)
        excess = diff / (atol + rtol * w.abs().nan_to_num(0.0, posinf=0.0))
        chunk_ex = float(excess.max())
        max_abs = max(max_abs, float(diff.max()))
        if not chunk_ex <= max_ex:      # also catches NaN, which wins
            max_ex, worst = chunk_ex, lo + int(excess.argmax())
    ok = not nan_mismatch and max_ex <= 1.0
    reason = ""
    if not ok:
        if nan_mismatch:
            reason = f"'{name}': NaN where the reference has none (or the reverse)"
        else:
            reason = (f"'{name}' differs by {max_abs:.3g} (element {worst}: got "
                      f"{float(g_all[worst]):.6g}, want {float(w_all[worst]):.6g}; "
                      f"tolerance atol={atol:g}, rtol={rtol:g})")
    return ok, max_abs, max_ex, reason


def compare_exact(program: Program, vid: str, got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor,
                  atol: float | None = None, rtol: float | None = None) -> tuple[bool, float, float, str]:
    """compare() against the float64 value `exact`, the tolerance widened by twice the worst error of
    the fp32 reference `want` itself: a candidate as accurate as torch's fp32 passes. Its reason, when
    it fails, is what to add to compare()'s against the fp32 reference."""
    if atol is None or rtol is None:
        atol, rtol = tolerance(program)
    got, want, exact = (t.detach().reshape(-1) for t in (got, want.to(got.device), exact.to(got.device)))
    noise = 0.0
    for lo in range(0, exact.numel(), COMPARE_CHUNK):
        w, e = want[lo:lo + COMPARE_CHUNK].double(), exact[lo:lo + COMPARE_CHUNK].double()
        noise = max(noise, float((w - e).abs().nan_to_num(0.0, posinf=0.0).max()))
    ok, max_abs, max_ex, _ = compare(program, vid, got, exact, atol + 2 * noise, rtol)
    why = "" if ok else (f"; against the float64 reference it is off by up to {max_abs:.3g}, torch's fp32 by "
                         f"up to {noise:.3g}")
    return ok, max_abs, max_ex, why


def _rounding_sized(err: float, want: torch.Tensor) -> bool:
    """Whether a miss of `err` could be fp32 rounding (at most 1% of the output's largest value): only
    then is the float64 recomputation worth its time (a wrong kernel mostly misses by far more)."""
    if not want.is_floating_point() or not err == err:
        return False
    return err <= 1e-2 * float(want.detach().abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).max())


def exact_outputs(program: Program, inputs: list[str], outputs: list[str], ins: list[torch.Tensor],
                  params: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor] | None:
    """`outputs` recomputed in float64 from the values `inputs` (given as `ins`, upcast) and the
    program's parameters (`params`, default drawn as the reference draws them): only the nodes between
    them run, and only the parameters they read are upcast. None where an op has no float64 form."""
    def upcast(t):
        return t.cpu().double() if t.is_floating_point() else t.cpu()
    try:
        env = {v: upcast(t) for v, t in zip(inputs, ins)}
        needed, read, stack = set(), set(), [v for v in outputs if v not in env]
        while stack:          # the nodes the outputs depend on, back to the given values and parameters
            vid = stack.pop()
            if program.values[vid].producer is None:
                read.add(vid)
                continue
            node = program.nodes[program.values[vid].producer]
            if node.id not in needed:
                needed.add(node.id)
                stack += [v for v in node.inputs if v is not None and v not in env]
        params = params if params is not None else parameter_tensors(program, "cpu")
        env.update({v: upcast(params[v]) for v in read})     # only the parameters those nodes read
        from .reference import run_node
        with torch.no_grad():
            for nid in program.topo_order():
                if nid in needed:
                    run_node(program, nid, env)
        return [env[v] for v in outputs]
    except Exception:   # noqa: BLE001 - no second opinion: the fp32 verdict stands
        return None


def check_draws(program: Program, outputs: list[str], sample, run, *, draws: int = 5, device: str = "cuda",
                atol: float | None = None, rtol: float | None = None, who: str = "the candidate",
                exact=None) -> VerifyResult:
    """The one verification loop: for d in range(draws), sample(d) -> (input tensors, expected
    outputs), run(inputs on `device`) -> outputs, compared value by value. Never raises for a
    mismatch or a failing run: the result says why. Holds the GPU lock shared (see profile.timing).
    exact(inputs) -> the expected outputs in float64 (or None): a float output that misses the fp32
    reference passes if it is as accurate as the reference against them (compare_exact)."""
    from .profile.timing import gpu_work
    worst_abs, worst_ex, per = 0.0, 0.0, {}

    def run_on_device(ins):
        got = run([t.to(device) for t in ins])
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return got
    with gpu_work():
        for d in range(draws):
            try:
                ins, want = _again_if_out_of_memory(lambda: sample(d))
            except Exception as exc:  # e.g. class targets drawn outside [0, C): nothing to compare against
                if _out_of_memory(exc):
                    return VerifyResult(False, d, reason=f"draw {d}: the reference ran out of memory twice "
                                                         f"({first_line(exc)}): other processes hold the GPU's "
                                                         f"memory, or the region needs more than it has")
                return VerifyResult(False, d, reason=f"draw {d}: the reference cannot run on this random draw "
                                                     f"({type(exc).__name__}: {first_line(exc)}); give the input "
                                                     f"an init hint with its valid range")
            try:
                got = _again_if_out_of_memory(lambda: run_on_device(ins))
            except StitchError as exc:
                return VerifyResult(False, d, reason=f"draw {d}: {exc}")
            except Exception as exc:  # a launch or driver failure is a failed candidate, not a crash
                return VerifyResult(False, d, reason=f"draw {d}: {who} raised {type(exc).__name__}: "
                                                     f"{first_line(exc)}")
            if len(got) != len(outputs):
                return VerifyResult(False, d, reason=f"{who} returned {len(got)} outputs, want {len(outputs)}")
            exact_outs = None
            for i, (vid, g, w) in enumerate(zip(outputs, got, want)):
                ok, ab, ex, why = compare(program, vid, g, w, atol, rtol)
                if not ok and exact is not None and _rounding_sized(ab, w):
                    exact_outs = exact_outs or exact(ins) or [None] * len(outputs)
                    if exact_outs[i] is not None:
                        ok, ab, ex, more = compare_exact(program, vid, g, w, exact_outs[i], atol, rtol)
                        why += more
                worst_abs, worst_ex = max(worst_abs, ab), max(worst_ex, ex)
                per[vid] = max(per.get(vid, 0.0), ab)
                if not ok:
                    return VerifyResult(False, d + 1, worst_abs, worst_ex, f"draw {d}: {why}", per)
    return VerifyResult(True, draws, worst_abs, worst_ex, "", per)


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or says_out_of_memory(exc)


def _again_if_out_of_memory(step):
    """step(), once more after the allocator's cached blocks are given back if it ran out of memory:
    under bench --jobs the other problems' memory comes and goes, and a region whose reference could
    not run then was counted as failing its check (74 of 30_SwinTransformerV2's regions on the H100)."""
    try:
        return step()
    except Exception as exc:
        if not _out_of_memory(exc):
            raise
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return step()


def verify_region(program: Program, inputs: list[str], outputs: list[str],
                  run: Callable[[list[torch.Tensor]], list[torch.Tensor]], *, draws: int = 5,
                  device: str = "cuda", atol: float | None = None, rtol: float | None = None,
                  seed: int = 0) -> VerifyResult:
    """Run `run` (the candidate: region input tensors on `device` -> output tensors) on `draws` random
    draws (seeds seed..) of the whole program's reference and compare."""
    return check_draws(program, outputs, lambda d: region_samples(program, inputs, outputs, seed + d), run,
                       draws=draws, device=device, atol=atol, rtol=rtol,
                       exact=lambda ins: exact_outputs(program, inputs, outputs, ins))
