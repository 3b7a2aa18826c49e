"""What the profile plots show, gathered from agent events (live or replayed) and profile.json.

Plain Python (no Qt): one ProfileData per run. `apply(event)` folds one event in and returns the names
of the plots it changed, so a widget redraws only those; `load_profile(dict)` reads the file optimize
writes (the same facts, after the run).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from agent_core.program_runtime.memory_plan import memory_summary

BANDWIDTH_GBS = 4200.0   # H200 measured copy bandwidth (DESIGN.md) until the run's hardware says otherwise
PEAK_TFLOPS = 51.0       # H200 fp32 cuBLAS
BASELINES = ("eager", "compile_default", "compile_reduce-overhead")


@dataclass
class Kernel:
    region: str
    kind: str = ""
    kernel: str | None = None
    est_before_ms: float | None = None
    est_after_ms: float | None = None
    unfused_ms: float | None = None     # measured: the region's ops one by one
    ms: float | None = None             # measured: the generated kernel (after tuning)
    floor_ms: float | None = None
    bytes: float | None = None
    flops: float | None = None
    achieved_gbs: float | None = None
    achieved_tflops: float | None = None
    bound: str | None = None
    status: str = "proposed"            # the agent's outcome once known (fused, fallback, library, ...)
    reason: str = ""                    # why the agent reached that outcome

    @property
    def before_ms(self) -> float | None:
        return self.unfused_ms if self.unfused_ms is not None else self.est_before_ms

    @property
    def after_ms(self) -> float | None:
        return self.ms if self.ms is not None else self.est_after_ms

    @property
    def measured(self) -> bool:
        return self.ms is not None


@dataclass
class TuneStep:
    trial: int
    ms: float | None
    ok: bool
    best: bool
    params: dict = field(default_factory=dict)
    reason: str = ""


class ProfileData:
    def __init__(self):
        self.kernels: dict[str, Kernel] = {}     # region id -> kernel, in program order
        self.tuning: dict[str, list[TuneStep]] = {}
        self.end_to_end: dict[str, float | None] = {}   # "ours" and each baseline -> ms (None: failed)
        self.baseline_errors: dict[str, str] = {}
        self.bandwidth_gbs = BANDWIDTH_GBS
        self.peak_tflops = PEAK_TFLOPS
        self.hardware: str = ""
        self.plan: dict = {}
        self.launches: int | None = None     # end to end, as the generated program runs
        self.memory: dict = {}               # the program's memory plan (memory_plan.memory_summary)
        self.gpu: bool | None = None         # None: not known yet; False: the run had no GPU to time on
        self.finished = False                # a done or fatal error event, or a profile.json, was read
        self.outcome: str = ""               # the run's last word: done, no-gpu, or the fatal error
        self.live = False                    # events arrive from a run in progress (ProfilePanel.apply)

    # events ------------------------------------------------------------------------------------
    def kernel(self, rid: str) -> Kernel:
        if rid not in self.kernels:
            self.kernels[rid] = Kernel(rid)
        return self.kernels[rid]

    def apply(self, e: dict) -> set[str]:
        """Fold one event in; the names of the plots that changed ("kernels", "e2e", "timeline",
        "roofline", "tuning")."""
        name = e.get("event")
        rid = e.get("region")
        if name == "plan":
            self.plan = {k: e.get(k) for k in ("unfused_ms", "planned_ms", "floor_ms")}
            return {"e2e"}
        if name == "region-proposed" and rid:
            k = self.kernel(rid)
            k.kind = e.get("kind") or k.kind
            k.est_before_ms, k.est_after_ms = e.get("est_before_ms"), e.get("est_after_ms")
            return {"kernels", "timeline"}
        if name == "codegen" and rid:
            k = self.kernel(rid)
            k.kernel = e.get("kernel")
            if e.get("bytes"):
                k.bytes = float(e["bytes"])
            return set()
        if name == "log" and e.get("hardware"):
            hw = e["hardware"]
            self.bandwidth_gbs = float(hw.get("copy_bandwidth_gbs") or self.bandwidth_gbs)
            self.hardware = str(hw.get("name") or "")
            self.gpu = True
            return {"roofline", "summary"}
        if name == "log" and e.get("no_gpu"):
            self.gpu = False
            return {"summary"}
        if name == "log" and rid and e.get("status"):
            k = self.kernel(rid)
            k.status = e["status"]
            # the message is "region r1: fused: <reason>"
            k.reason = str(e.get("message") or "").split(f"{e['status']}: ", 1)[-1]
            return {"kernels", "timeline", "summary"}
        if name == "fallback" and rid:
            k = self.kernel(rid)
            k.status, k.reason = "fallback", str(e.get("reason") or "")
            return {"kernels", "timeline", "summary"}
        if name == "done":
            self.finished, self.outcome = True, str(e.get("status") or "done")
            if self.outcome == "no-gpu":
                self.gpu = False
            return {"tuning", "summary"}
        if name == "error" and e.get("fatal"):
            self.finished, self.outcome = True, f"failed: {e.get('message') or 'the worker stopped'}"
            return {"tuning", "summary"}
        if name == "tune-step" and rid:
            self.tuning.setdefault(rid, []).append(TuneStep(int(e.get("trial", 0)), e.get("ms"), bool(e.get("ok")),
                                                            bool(e.get("best")), e.get("params") or {},
                                                            e.get("reason") or ""))
            return {"tuning"}
        if name == "profile":
            scope = e.get("scope")
            if scope == "region" and rid:
                self._measured(self.kernel(rid), e)
                return {"kernels", "timeline", "roofline"}
            if scope == "program":
                self.end_to_end["ours"] = e.get("ms")
                if e.get("launches") is not None:
                    self.launches = int(e["launches"])
                if isinstance(e.get("memory"), dict):
                    self.memory = dict(e["memory"])
                return {"e2e", "summary"}
            if scope == "baseline" and e.get("baseline"):
                self.end_to_end[e["baseline"]] = e.get("ms") if e.get("ok", True) else None
                if e.get("error"):
                    self.baseline_errors[e["baseline"]] = str(e["error"])
                return {"e2e", "summary"}
        return set()

    def _measured(self, k: Kernel, d: dict) -> None:
        k.ms = d.get("ms", d.get("fused_ms"))
        k.unfused_ms = d.get("unfused_ms", k.unfused_ms)
        for f in ("floor_ms", "achieved_gbs", "achieved_tflops", "bound", "bytes", "flops"):
            if d.get(f) is not None:
                setattr(k, f, d[f])
        k.kernel = d.get("kernel") or k.kernel

    # profile.json ------------------------------------------------------------------------------
    def load_profile(self, prof: dict, regions=()) -> None:
        """Read optimize's profile.json; `regions` (agent_core Regions) supply kinds and estimates."""
        for r in regions:
            if r.status == "rejected":
                continue
            k = self.kernel(r.id)
            k.kind, k.est_before_ms, k.est_after_ms = r.kind, r.est_before_ms, r.est_after_ms
        if prof:
            self.finished = True
            self.outcome = str(prof.get("status") or self.outcome or "done")
            if "gpu" in prof:
                self.gpu = bool(prof["gpu"])
        hw = prof.get("hardware") or {}
        if hw.get("copy_bandwidth_gbs"):
            self.bandwidth_gbs = float(hw["copy_bandwidth_gbs"])
        self.hardware = str(hw.get("name") or self.hardware)
        for o in prof.get("regions") or []:
            rid = o.get("region")
            if not rid:
                continue
            k = self.kernel(rid)
            k.status = o.get("status") or k.status
            k.reason = o.get("reason") or k.reason
            k.kernel = o.get("kernel") or k.kernel
            att = dict(o.get("attribution") or {})
            if o.get("fused_ms") is not None:
                att.setdefault("ms", o["fused_ms"])
            if o.get("unfused_ms") is not None:
                att["unfused_ms"] = o["unfused_ms"]
            if "ms" in att:
                self._measured(k, att)
            trials = o.get("trials") or []
            if trials:
                self.tuning[rid] = [TuneStep(int(t.get("trial", 0)), t.get("ms"), bool(t.get("ok")),
                                             bool(t.get("best")), t.get("params") or {}, t.get("reason") or "")
                                    for t in trials]
        e2e = prof.get("end_to_end") or {}
        if e2e.get("ms") is not None:
            self.end_to_end["ours"] = e2e["ms"]
        if e2e.get("launches") is not None:
            self.launches = int(e2e["launches"])
        mem = e2e.get("memory")
        if isinstance(mem, dict) and mem.get("predicted_peak_bytes") is not None:
            self.memory = memory_summary(mem)
        for key, b in (prof.get("baselines") or {}).items():
            if isinstance(b, dict):
                self.end_to_end[key] = b.get("ms") if b.get("ok") else None
                if b.get("error") or b.get("skipped"):
                    self.baseline_errors[key] = str(b.get("error") or b.get("skipped"))

    # derived -----------------------------------------------------------------------------------
    def order(self, slowest_first: bool = False, top: int | None = None) -> list[str]:
        """Region ids in program order, or slowest (fused, else unfused time) first; `top` keeps the
        `top` slowest, in the order asked for."""
        ids = list(self.kernels)
        def cost(rid):
            k = self.kernels[rid]
            return k.after_ms or k.before_ms or 0.0
        slow = sorted(ids, key=lambda r: (-cost(r), ids.index(r)))   # ties keep program order
        if top is not None:
            keep = set(slow[:top])
            ids = [r for r in ids if r in keep]
            slow = slow[:top]
        return slow if slowest_first else ids

    def timeline(self, after: bool, regions: list[str] | None = None,
                 packed: bool = False) -> list[tuple[str, float, float, bool]]:
        """(region, start ms, duration ms, measured) for the kernel sequence before or after fusion:
        regions run one after another on one stream, so starts are running sums. `regions` picks and
        orders what is shown; without `packed` a region keeps its start in the whole program (the
        ones left out leave gaps, as in a trace viewer), with it the shown ones are laid end to end."""
        starts, t = {}, 0.0
        for rid, k in self.kernels.items():
            ms = k.after_ms if after else k.before_ms
            if ms:
                starts[rid] = (t, ms, k.measured if after else k.unfused_ms is not None)
                t += ms
        out, t = [], 0.0
        for rid in (list(self.kernels) if regions is None else regions):
            if rid not in starts:
                continue
            start, ms, real = starts[rid]
            out.append((rid, t if packed else start, ms, real))
            t += ms
        return out

    def outcomes(self) -> dict[str, list[str]]:
        """Region ids by the agent's outcome (fused, library, fallback, compiled, ...), program order."""
        out: dict[str, list[str]] = {}
        for rid, k in self.kernels.items():
            if k.status != "proposed":
                out.setdefault(k.status, []).append(rid)
        return out

    def roofline_points(self) -> list[tuple[str, float, float]]:
        """(region, FLOP per byte, achieved GFLOP/s) of each measured kernel that moves bytes."""
        pts = []
        for rid, k in self.kernels.items():
            if k.ms and k.bytes:
                flops = k.flops or 0.0
                ai = max(flops / k.bytes, 1e-3)   # pointwise kernels do ~no FLOPs: pinned to the left edge
                gflops = max(flops / (k.ms * 1e-3) / 1e9, 1e-3) if flops else k.bytes / (k.ms * 1e-3) / 1e9 * ai
                pts.append((rid, ai, gflops))
        return pts

    def has_measurements(self) -> bool:
        return any(k.measured for k in self.kernels.values()) or bool(self.end_to_end)
