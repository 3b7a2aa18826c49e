"""What an end-to-end program holds in GPU memory at each step, and what each split-TF32 call keeps.

Every intermediate is a torch allocation made by the step that writes it and dropped after the last
step that reads it (executable._execute), generated kernels' outputs included, so kernels, library
calls and their temporaries share one caching allocator (inside a CUDA graph, its private pool) and
our peak is that of one live set, as eager's is. A static arena for the kernels' outputs beside that
pool added two peaks instead (H200, 11_VGG16 at 3883459: a 193 MB arena plus 96 MB of pool against
eager's 257 MB in all).

The model, per step: the values alive there (from the step that writes one to the last that reads it;
values inside a kernel never exist; a view adds nothing, nor does a pointwise kernel's output written
over an input that dies with it, written_over), plus the step's temporaries (a channels-last
call's input copy, a split call's parts, and what agent.precision measured the call's chosen form to
allocate beyond those and beyond plain fp32's: a larger cuDNN workspace), plus the parameter caches of
the whole run (split-TF32 parts, concatenated convolution weights, channels-last weights) and the
generated kernels' workspaces (kernel_scratch). The peak is its maximum. A cache the budget cannot
hold is dropped: its weight is then split or converted every call instead.

A split-TF32 form trades memory for speed: its activation's parts, and its weight's parts either
cached for the run or made per call. The budget is eager's peak (estimated from liveness,
eager_peak_estimate, over the program as eager runs it: the agent records the imported program's
figure before its rewrites, program.metadata["eager_peak_estimate_bytes"], since a rewrite can add a
value eager never holds) unless the program's memory_budget_bytes or the caller sets one. While
the predicted peak is above it: the largest cache is dropped when splitting its weight per call does
not raise the peak, unless splitting per call costs more time than the split saves against fp32
(agent.precision's timings, program.metadata["library_precision_gain_ms"]), when its calls run in fp32;
else the heaviest split call at the peak step runs in plain fp32 (a split-K call's partial products
count like a split call's parts: runtime/split_k.py); else the calls of the largest cache run in fp32.
Each choice is a recorded decision (MemoryDecision).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.gpu import H200, GPUProfile
from ..analysis.liveness import buffers, lifetimes
from ..ir import Program, Role
from ..runtime.low_precision import FORMS as LOWER, cast_bytes
from ..runtime.split_k import SPLIT_K, parts as split_k_parts
from ..runtime.split_tf32 import (CHANNELS_LAST, TF32X3, TF32X3_CAT, can_concatenate, library_layout,
                                  library_precision)

MIB = 1 << 20
ROUND = 512          # the caching allocator rounds every block up to this


def rounded(nbytes: int) -> int:
    """A block's bytes as the caching allocator holds them."""
    return (nbytes + ROUND - 1) // ROUND * ROUND


def _is_param(program: Program, vid: str) -> bool:
    return program.values[vid].role in (Role.PARAMETER, Role.CONSTANT)


def _bytes(program: Program, vid: str) -> int:
    return rounded(program.values[vid].nbytes)


@dataclass
class MemoryDecision:
    """One split-TF32 or split-K call: how it runs (its agent-chosen form, or fp32), and its weights' parts."""
    node_id: str
    chosen: str                 # the agent's form (3xtf32, 3xtf32-cat, fp32-splitk)
    runs_as: str                # the same, or "fp32"
    weights: str                # "cached", "split per call" or "none" (no parameter operand)
    cache_bytes: int            # what caching its weights costs (0 when none)
    temp_bytes: int             # its temporaries while it runs
    reason: str

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "runs_as": self.runs_as, "weights": self.weights,
                "cache_bytes": self.cache_bytes, "temp_bytes": self.temp_bytes, "reason": self.reason}


@dataclass
class MemoryPlan:
    budget_bytes: int
    budget_source: str
    predicted_peak_bytes: int
    peak_step: int                       # where the predicted peak is reached (-1: no step)
    cache_bytes: int                     # parameter caches, held for the whole run
    decisions: dict[str, MemoryDecision] = field(default_factory=dict)
    weights_per_call: set[str] = field(default_factory=set)   # calls that split or convert their weights every call
    written_over: dict[str, str] = field(default_factory=dict)  # kernel output -> the input whose buffer it takes

    def summary(self) -> dict:
        """The figures the studio shows: predicted peak, budget, and how many calls changed to fit."""
        return {"predicted_peak_bytes": self.predicted_peak_bytes, "budget_bytes": self.budget_bytes,
                "budget": self.budget_source, "cache_bytes": self.cache_bytes,
                "run_as_fp32": sum(1 for d in self.decisions.values() if d.runs_as == "fp32"),
                "weights_per_call": len(self.weights_per_call)}

    def to_dict(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "budget": self.budget_source,
                "predicted_peak_bytes": self.predicted_peak_bytes, "peak_step": self.peak_step,
                "cache_bytes": self.cache_bytes, "weights_per_call": sorted(self.weights_per_call),
                "written_over": dict(self.written_over),
                "split_tf32": {n: d.to_dict() for n, d in self.decisions.items()}}


def memory_summary(plan: dict) -> dict:
    """The figures the studio shows, from MemoryPlan.to_dict(): predicted peak, budget, and how many
    calls changed to fit (the run's profile event carries it; profile.json the whole plan)."""
    return {"predicted_peak_bytes": plan["predicted_peak_bytes"], "budget_bytes": plan.get("budget_bytes"),
            "budget": plan.get("budget", ""), "cache_bytes": plan.get("cache_bytes", 0),
            "run_as_fp32": sum(1 for d in (plan.get("split_tf32") or {}).values() if d.get("runs_as") == "fp32"),
            "weights_per_call": len(plan.get("weights_per_call") or [])}


def eager_peak_estimate(program: Program) -> int:
    """Eager's peak activation bytes as its allocator would hold them: every value from the op that
    makes it to its last reader in program order, views and the results of eager's in-place ops (the
    importer's note) folded into the buffers they share, parameters and inputs left out (the measured
    figure leaves them out too), outputs to the end."""
    in_place = (program.nodes[n] for n in program.metadata.get("eager_in_place") or () if n in program.nodes)
    lt = lifetimes(program, shares={n.outputs[0]: n.inputs[0] for n in in_place})
    delta = [0] * (len(program.nodes) + 3)
    for life in lt.values():
        if life.start < 0:
            continue
        delta[life.start + 1] += rounded(life.nbytes)
        delta[life.end + 2] -= rounded(life.nbytes)
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _events(program: Program, steps):
    """Every event of the run in order (Step.events) as (step index, library node id or None, reads,
    writes), and a node order that lists each step's library calls first (a valid topological order:
    a kernel step's library calls never read its kernel)."""
    events, order = [], []
    for i, s in enumerate(steps):
        lib = list(s.library_nodes) if s.kind == "kernel" else ([] if s.view else list(s.nodes))
        for (reads, writes), nid in zip(s.events(program), lib + [None]):
            events.append((i, nid, reads, writes))
        order += [n for n in s.nodes if n in s.library_nodes] + [n for n in s.nodes if n not in s.library_nodes]
    return events, order


def written_over(program: Program, steps, order) -> dict[str, str]:
    """{kernel output: kernel input} where the output is written into the input's buffer, as eager's
    relu_ writes over its input: a pointwise kernel with one output reads each input of the output's
    shape and dtype only at the element it writes, after the loads that element needs, so an input whose
    buffer no later step reads (not a program input or output, no view of it kept) can take the result.
    A library call + epilogue (conv -> relu) then holds one map, not two."""
    lt, root = lifetimes(program, order), buffers(program, order)
    pos = {n: i for i, n in enumerate(order)}
    kept = {root.get(v, v) for v in list(program.inputs) + list(program.outputs)}
    out: dict[str, str] = {}
    for s in steps:
        ks = s.kernel
        if s.kind != "kernel" or ks.kind != "pointwise" or len(ks.outputs) != 1:
            continue
        o = ks.outputs[0]
        last = max(pos[n] for n in s.nodes)
        roots = [root.get(v, v) for v in ks.inputs]
        for v, b in zip(ks.inputs, roots):
            life = lt.get(b)
            if life is None or b in kept or life.end > last or roots.count(b) > 1 or \
                    program.values[v].spec != program.values[o].spec:
                continue
            out[o] = v
            break
    return out


def _torch_views(program: Program, steps) -> dict[str, str]:
    """The torch steps that run as views (a reshape; a slice only library calls read), by the value
    they make: it shares its input's buffer."""
    return {program.nodes[s.nodes[0]].outputs[0]: program.nodes[s.nodes[0]].inputs[0]
            for s in steps if s.kind == "torch" and s.view}


def _live_per_event(program: Program, steps, events, order, shares: dict[str, str]) -> list[int]:
    """Bytes of the values alive at each event (a program output to the last one). A value exists only
    when some event writes it (values inside a kernel never do); a view adds nothing."""
    event_of: dict[str, int] = {}
    real: set[str] = set()
    last_of_step: dict[int, int] = {}
    for k, (i, nid, _, writes) in enumerate(events):
        real.update(writes)
        if nid is not None:
            event_of[nid] = k
        last_of_step[i] = k
    for i, s in enumerate(steps):
        for n in s.nodes:
            event_of.setdefault(n, last_of_step[i])     # a kernel's own nodes: its launch
    n = len(events)
    delta = [0] * (n + 1)
    for vid, life in lifetimes(program, order, shares).items():
        if life.start < 0 or vid not in real:
            continue
        start = event_of[order[life.start]]
        end = n - 1 if life.end >= len(order) else event_of[order[life.end]]
        delta[start] += rounded(life.nbytes)
        delta[max(start, end) + 1] -= rounded(life.nbytes)
    live, out = 0, []
    for i in range(n):
        live += delta[i]
        out.append(live)
    return out


def _kernel_copies(program: Program, events, layout: dict) -> list[int]:
    """Per event, the contiguous copy a kernel makes of a channels-last output it reads."""
    cl_out = {program.nodes[n].outputs[0] for n, lay in layout.items()
              if lay == CHANNELS_LAST and n in program.nodes and program.nodes[n].outputs}
    return [sum(_bytes(program, v) for v in reads if v in cl_out) if nid is None else 0
            for _, nid, reads, _ in events]


def _gemm_sums_in_place(program: Program, nid: str) -> bool:
    """Whether split_tf32._gemm_sum adds the three products into one output (no product temporaries)."""
    node = program.nodes[nid]
    a, b = (program.values[v] for v in node.inputs[:2])
    if node.op == "linear":
        return len(b.shape) == 2
    return node.op in ("matmul", "bmm") and len(a.shape) == len(b.shape) in (2, 3) and a.shape[:-2] == b.shape[:-2]


def _call_costs(program: Program, nid: str, form: str | None, cached: bool,
                cl: bool | None = None) -> tuple[int, dict[tuple, int]]:
    """(temporary bytes while the call runs, {(parameter, kind): cache bytes}) of one library call run
    as `form` (None: plain fp32) in its layout (cl: channels-last, default the program's choice), its
    weights' parts cached or not (runtime.split_tf32)."""
    node = program.nodes[nid]
    a = node.inputs[0]
    b = node.inputs[1] if len(node.inputs) > 1 else None
    cl = library_layout(program).get(nid) == CHANNELS_LAST if cl is None else cl
    caches: dict[tuple, int] = {}
    if form == TF32X3_CAT:      # the input's parts built in place, in its layout
        temp = 3 * _bytes(program, a)
        if _is_param(program, b) and cached:
            caches[(b, "cat-cl" if cl else "cat")] = 3 * _bytes(program, b)
        else:
            temp += 3 * _bytes(program, b)
        return temp, caches
    temp = 0
    if cl:   # a weight converted once (or every call); the input copied, but split into channels-last parts
        temp += 0 if form == TF32X3 else _bytes(program, a)
        if b and _is_param(program, b) and cached:
            caches[(b, "cl")] = _bytes(program, b)
        elif b:
            temp += _bytes(program, b)
    if form in LOWER:           # half-precision copies of the operands and the result, made per call
        temp += cast_bytes(program, nid, form)
    if form == SPLIT_K:         # the partial products, one output's worth a part
        temp += split_k_parts(program, nid) * _bytes(program, node.outputs[0])
    if form == TF32X3:
        temp += 0 if _gemm_sums_in_place(program, nid) else _bytes(program, node.outputs[0])
        for vid in (a, b):
            if _is_param(program, vid) and cached:
                caches[(vid, "split-cl" if cl else "split")] = 2 * _bytes(program, vid)
            else:
                temp += 2 * _bytes(program, vid)
    return temp, caches


def call_temp_bytes(program: Program, nid: str, form: str, channels_last: bool) -> int:
    """The modeled temporaries of one call run as `form` ("fp32", "fp32-timed", a split form) in the
    layout given, its weights' parts cached: what agent.precision's measurement is compared with."""
    modeled = form if form in (TF32X3, TF32X3_CAT, SPLIT_K, *LOWER) else None
    return _call_costs(program, nid, modeled, True, channels_last)[0]


def layout_weight_bytes(program: Program, nid: str) -> int:
    """The bytes of a channels-last call's parameter weight in channels-last memory: present at the
    call either way, as a cache or as a per-call copy (the plan decides which), and left out of
    agent.precision's measurement, which runs with it cached."""
    node = program.nodes[nid]
    b = node.inputs[1] if len(node.inputs) > 1 else None
    return _bytes(program, b) if b and _is_param(program, b) else 0


def split_parts_bytes(program: Program, nid: str, form: str, channels_last: bool) -> int:
    """The least a split form adds at its call beyond plain fp32 (its weights' parts cached): the
    activation's parts, and a product temporary where the sum is not made in place."""
    return (_call_costs(program, nid, form, True, channels_last)[0]
            - _call_costs(program, nid, None, True, channels_last)[0])


def default_budget(program: Program) -> tuple[int, str]:
    """(bytes, where they come from) of the budget when the caller gives none: the program's
    memory_budget_bytes, else eager's peak as estimated on the program eager runs (the figure the agent
    recorded before rewriting: 5_AlexNet's bias rewrite puts a second 1.2 GB value beside its first
    convolution's output, which eager's in-place ReLU never holds: 2269 MiB rewritten, 1408 as
    imported, against 1955 measured with cuDNN's workspaces), else this program's own estimate."""
    meta = program.metadata
    if meta.get("memory_budget_bytes") is not None:
        return int(meta["memory_budget_bytes"]), "the program's memory_budget_bytes"
    if meta.get("eager_peak_estimate_bytes") is not None:
        return int(meta["eager_peak_estimate_bytes"]), "eager's peak, estimated from the program before its rewrites"
    return eager_peak_estimate(program), "eager's peak, estimated from the program"


def split_room(program: Program, steps, budget: int | None = None) -> dict[str, int]:
    """Per library call, the bytes a split form's parts may take there before the predicted peak
    passes the budget, with every call in plain fp32 and no caches (agent.precision skips timing the
    forms that cannot fit)."""
    budget = int(budget) if budget is not None else default_budget(program)[0]
    events, order = _events(program, steps)
    shares = {**_torch_views(program, steps), **written_over(program, steps, order)}
    base = _live_per_event(program, steps, events, order, shares)
    return {nid: budget - base[k] for k, (_, nid, _, _) in enumerate(events) if nid is not None}


def kernel_scratch(steps) -> dict[tuple, int]:
    """The generated kernels' workspaces (row states shared between CTAs, a split-K running sum and
    turns): made once per kernel and held for the run (runtime.launch), so they count like caches.
    Kernels of the same source share theirs."""
    out: dict[tuple, int] = {}
    for s in steps:
        # a planned step (steps.planned_steps) stands for a kernel not generated yet: no workspace known
        workspace = getattr(s.kernel, "workspace", None) if s.kind == "kernel" else None
        if workspace:
            out[("scratch", s.kernel.name)] = sum(4 * max(1, n) for _dt, n in workspace)
    return out


def _per_call_ms(program: Program, nid: str, form: str, gpu: GPUProfile = H200) -> float:
    """What splitting a call's parameter operands every call costs: reading each and writing its parts
    (two, or three concatenated), at the copy bandwidth."""
    node = program.nodes[nid]
    ops = node.inputs[1:2] if form == TF32X3_CAT else node.inputs[:2]
    parts = 3 if form == TF32X3_CAT else 2
    moved = sum((1 + parts) * _bytes(program, v) for v in ops if v and _is_param(program, v))
    return moved / gpu.bytes_per_ms


def plan_memory(program: Program, steps, budget: int | None = None) -> MemoryPlan:
    """The predicted peak of running `steps` (program_runtime.steps) and the split-TF32 decisions that
    keep it within the budget (see the module docstring)."""
    layout = library_layout(program)
    precision = library_precision(program)
    workspace = program.metadata.get("library_workspace_bytes") or {}
    if budget is None:
        budget, source = default_budget(program)
    else:
        source = "given"
    events, order = _events(program, steps)
    over = written_over(program, steps, order)
    live = _live_per_event(program, steps, events, order, {**_torch_views(program, steps), **over})

    def base_of(demoted) -> list[int]:   # a call set back to fp32 runs in its input's layout: no copies
        kept = {n: lay for n, lay in layout.items() if n not in demoted}
        return [a + b for a, b in zip(live, _kernel_copies(program, events, kept))]
    library = [(k, nid) for k, (_, nid, _, _) in enumerate(events) if nid is not None]
    scratch = kernel_scratch(steps)
    calls = [nid for _, nid in library if precision.get(nid) in (TF32X3, SPLIT_K)
             or (precision.get(nid) == TF32X3_CAT and can_concatenate(program, nid))]
    split = set(calls)
    demoted: set[str] = set()           # split calls run in fp32
    uncached: set[tuple] = set()        # caches dropped: their calls split the weight per call

    def layout_keys(nid) -> set:                 # a channels-last weight's copy
        return set(_call_costs(program, nid, None, True)[1])

    def cache_keys(nid) -> set:
        return set(_call_costs(program, nid, precision[nid], True)[1]) - layout_keys(nid)   # the split's own

    def runs_as(nid, demoted=demoted):
        return precision[nid] if nid in split and nid not in demoted else \
            (None if nid in split else precision.get(nid))

    def all_keys(nid, demoted=demoted) -> set:   # a call set back runs in its input's layout: no copy
        if nid not in split:
            return layout_keys(nid)
        return set() if nid in demoted else layout_keys(nid) | cache_keys(nid)

    def costs(nid, demoted=demoted, uncached=uncached):
        form = runs_as(nid, demoted)
        cl = False if nid in demoted else None       # set back: fp32 in its input's layout
        temp, held = _call_costs(program, nid, form, not (all_keys(nid, demoted) & uncached), cl)
        # the chosen form's measured workspace beyond the model (agent.precision); none once demoted
        return temp + (workspace.get(nid, 0) if form == precision.get(nid) else 0), held

    def predict(demoted=demoted, uncached=uncached):
        per_event = base_of(demoted)
        caches: dict[tuple, int] = dict(scratch)
        for k, nid in library:
            temp, held = costs(nid, demoted, uncached)
            per_event[k] += temp
            caches.update(held)
        at = max(range(len(per_event)), key=per_event.__getitem__, default=-1)
        peak = (per_event[at] if at >= 0 else 0) + sum(caches.values())
        return peak, at, per_event, caches

    event_of = {nid: k for k, nid in library}
    peak, at, per_event, caches = predict()
    gains = program.metadata.get("library_precision_gain_ms") or {}
    slower: set[str] = set()            # calls for which splitting per call costs more than the split saves

    def users(key) -> list[str]:
        return [n for n in calls if n not in demoted and key in cache_keys(n)]
    while peak > budget:
        droppable = {key: nb for key, nb in caches.items() if key not in uncached and key[0] != "scratch"}
        largest = max(droppable, key=droppable.get) if droppable else None
        here = [n for n in calls if n not in demoted and event_of[n] == at]
        losing = [n for n in users(largest) if n in gains and _per_call_ms(program, n, precision[n]) >= gains[n]] \
            if largest is not None else []
        if losing:                       # fp32 is faster than splitting these weights per call, and lighter
            slower.update(losing)
            demoted.update(losing)
        elif largest is not None and predict(demoted, uncached | {largest})[0] <= peak:
            uncached.add(largest)        # split per call: its parts exist only while the call runs
        elif here:
            demoted.add(max(here, key=lambda n: costs(n)[0]))
        elif largest is not None and users(largest):
            demoted.update(users(largest))
        else:
            break                        # the values alone are above the budget: nothing to trade
        peak, at, per_event, caches = predict()
    peak_step = events[at][0] if at >= 0 else -1
    per_call = {nid for _, nid in library if all_keys(nid) & uncached}

    within = f"predicted peak {peak / MIB:.1f} MiB, budget {budget / MIB:.1f} MiB ({source})"
    decisions = {}
    for nid in calls:
        form = precision[nid]
        keys = cache_keys(nid)
        full = _call_costs(program, nid, form, True)[1]
        cache_nb = sum(nb for key, nb in full.items() if key in keys)
        temp = costs(nid)[0]
        if nid in slower:
            decisions[nid] = MemoryDecision(
                nid, form, "fp32", "none", cache_nb, temp,
                f"runs in fp32: caching its weights ({cache_nb / MIB:.1f} MiB) takes the peak above the budget, "
                f"and splitting them per call (about {_per_call_ms(program, nid, form):.3f} ms of copies) costs "
                f"more than the split saves ({gains[nid]:.3f} ms); {within}")
        elif nid in demoted and form == SPLIT_K:
            decisions[nid] = MemoryDecision(
                nid, form, "fp32", "none", 0, temp,
                f"runs in fp32: its {split_k_parts(program, nid)} partial products "
                f"({_call_costs(program, nid, form, True)[0] / MIB:.1f} MiB) take the peak above the budget; {within}")
        elif form == SPLIT_K:
            decisions[nid] = MemoryDecision(nid, form, form, "none", 0, temp,
                                            f"its {split_k_parts(program, nid)} partial products "
                                            f"({temp / MIB:.1f} MiB) fit; {within}")
        elif nid in demoted:
            t_all = _call_costs(program, nid, form, False)[0]
            decisions[nid] = MemoryDecision(
                nid, form, "fp32", "none", cache_nb, temp,
                f"runs in fp32: its split parts ({t_all / MIB:.1f} MiB per call, or "
                f"{cache_nb / MIB:.1f} MiB of cached weights) take the peak above the budget; {within}")
        elif not keys:
            decisions[nid] = MemoryDecision(nid, form, form, "none", 0, temp,
                                            f"no parameter operand: both split per call ({temp / MIB:.1f} MiB "
                                            f"of temporaries); {within}")
        elif keys & uncached:
            decisions[nid] = MemoryDecision(nid, form, form, "split per call", cache_nb, temp,
                                            f"weights split per call ({temp / MIB:.1f} MiB of temporaries): "
                                            f"caching them ({cache_nb / MIB:.1f} MiB) would take the peak "
                                            f"above the budget; {within}")
        else:
            decisions[nid] = MemoryDecision(nid, form, form, "cached", cache_nb, temp,
                                            f"weights split once and cached ({cache_nb / MIB:.1f} MiB): "
                                            f"within the budget; {within}")
    held = sum(nb for key, nb in caches.items() if key[0] != "scratch")    # the parameters' caches
    return MemoryPlan(budget, source, peak, peak_step, held, decisions, per_call, over)
