"""Where library calls put their outputs and temporaries, and what each split-TF32 call keeps.

Before this, only generated kernels' outputs lived in the lifetime-planned arena; every library call's
output and temporary was allocated by torch inside the CUDA graph's private pool and held until the run
ended (H200, 80_Gemm_Max_Subtract_GELU: eager 33.6 MB, ours 1.14 GB, 512 MiB of it split weights).
Now:
- a matmul-family call (linear, matmul, bmm, addmm, baddbmm) writes its output into an arena slot
  (torch's out= forms), so it shares bytes with every value whose lifetime it does not overlap;
- a split-TF32 call's (hi, lo) parts of an activation, and of a weight split per call, are arena
  slots live for the call's step only (split in place: no torch temporaries);
- every other torch step's outputs stay torch allocations, released after their last reader
  (executable._execute), so the pool reuses them as eager's allocator does.
Convolutions keep torch's own allocation: torch has no out= convolution that does not copy.

A split-TF32 weight's cache trades memory for speed (the weight is split once, not per call). The
caches are kept only while the predicted peak (arena + released torch values at their peak + caches)
stays within the budget (eager's peak, estimated from the program's own liveness unless given);
otherwise the largest are dropped first and their weights split per call into arena temporaries, and
if even that is above the budget, the calls whose temporaries weigh most run in plain fp32. Each
choice is a recorded decision (MemoryDecision) with the bytes it was made on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..analysis.liveness import lifetimes
from ..ir import Program, Role
from ..ops import DTYPE_BYTES
from ..runtime.split_tf32 import TF32X3, TF32X3_CAT, can_concatenate, library_precision
from .arena import ArenaPlan, plan_arena

OUT_OPS = frozenset({"linear", "matmul", "bmm", "addmm", "baddbmm"})
FLOATS = frozenset({"float32", "float16", "bfloat16", "float64"})
ROUND = 512          # the caching allocator's block rounding


def _rounded(n: int) -> int:
    return (n + ROUND - 1) // ROUND * ROUND


def writes_into_arena(program: Program, nid: str) -> bool:
    """Whether the node's torch call has an out= form that writes its one output in place."""
    node = program.nodes[nid]
    if node.op not in OUT_OPS or len(node.outputs) != 1:
        return False
    vals = [program.values[v] for v in list(node.inputs) + list(node.outputs) if v]
    if any(v.dtype not in FLOATS for v in vals):
        return False
    return node.op == "linear" or all(len(program.values[v].shape) >= 2 for v in node.inputs[:2] if v)


def gemm_split(program: Program, nid: str) -> bool:
    """Whether the 3xTF32 form is three GEMMs summed by cuBLAS (split_tf32._gemm_sum's shapes)."""
    node = program.nodes[nid]
    a, b = (program.values[v] for v in node.inputs[:2])
    ra, rb = len(a.shape), len(b.shape)
    if node.op == "linear":
        return rb == 2
    return node.op in ("matmul", "bmm") and ra == rb and ra in (2, 3) and a.shape[:-2] == b.shape[:-2]


@dataclass
class MemoryDecision:
    """One split-TF32 call: how it runs (its agent-chosen form, or fp32), and its weights' splits."""
    node_id: str
    chosen: str                 # the agent's form (3xtf32, 3xtf32-cat)
    runs_as: str                # the same, or "fp32" when even splitting per call is over the budget
    weights: str                # "cached", "split per call" or "none" (no parameter operand)
    cache_bytes: int            # what caching its weights costs (0 when none)
    temp_bytes: int             # its arena temporaries as it runs
    reason: str

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "runs_as": self.runs_as, "weights": self.weights,
                "cache_bytes": self.cache_bytes, "temp_bytes": self.temp_bytes, "reason": self.reason}


@dataclass
class LibraryMemory:
    """The arena plan of an executable, with what it holds and the decisions behind it."""
    arena: ArenaPlan
    kinds: dict[str, str] = field(default_factory=dict)          # slot -> kernel output / library output / split temporary
    temps: dict[str, tuple] = field(default_factory=dict)        # slot -> (shape, dtype) of a temporary
    decisions: dict[str, MemoryDecision] = field(default_factory=dict)
    budget_bytes: int = 0
    budget_source: str = ""
    predicted_peak_bytes: int = 0
    released_peak_bytes: int = 0    # torch values released after their last reader, at their peak
    cache_bytes: int = 0

    def to_dict(self) -> dict:
        by_kind: dict[str, int] = {}
        for vid, k in self.kinds.items():
            by_kind[k] = by_kind.get(k, 0) + 1
        return {"budget_bytes": self.budget_bytes, "budget": self.budget_source,
                "predicted_peak_bytes": self.predicted_peak_bytes, "arena_bytes": self.arena.total_bytes,
                "released_torch_peak_bytes": self.released_peak_bytes, "split_cache_bytes": self.cache_bytes,
                "arena_slots": by_kind, "split_tf32": {n: d.to_dict() for n, d in self.decisions.items()}}


def eager_peak_estimate(program: Program) -> int:
    """Eager's peak activation bytes as its allocator would hold them: every value from the op that
    makes it to its last reader in program order, views folded, parameters and inputs left out (the
    measured figure leaves them out too), outputs to the end."""
    lt = lifetimes(program)
    n = len(program.nodes)
    delta = [0] * (n + 3)
    for life in lt.values():
        if life.start < 0:
            continue
        delta[life.start + 1] += _rounded(life.nbytes)
        delta[life.end + 2] -= _rounded(life.nbytes)
    peak = live = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak


def _is_param(program: Program, vid: str) -> bool:
    return program.values[vid].role in (Role.PARAMETER, Role.CONSTANT)


def _split_temps(program: Program, nid: str, form: str, weights_cached: bool) -> dict[str, tuple]:
    """The arena temporaries of one split call: slot -> (shape, dtype)."""
    node = program.nodes[nid]
    a, b = node.inputs[0], node.inputs[1]
    out: dict[str, tuple] = {}
    if form == TF32X3_CAT:
        va, vb = program.values[a], program.values[b]
        spatial = int(node.op[-2])
        ch = len(va.shape) - spatial - 1
        w_dim = 0 if node.op.startswith("conv_transpose") else 1
        out[f"{nid}.a_cat"] = (tuple(d * 3 if i == ch else d for i, d in enumerate(va.shape)), va.dtype)
        if not (weights_cached and _is_param(program, b)):
            out[f"{nid}.w_cat"] = (tuple(d * 3 if i == w_dim else d for i, d in enumerate(vb.shape)), vb.dtype)
        return out
    for name, vid in (("a", a), ("b", b)):
        if weights_cached and _is_param(program, vid):
            continue
        v = program.values[vid]
        out[f"{nid}.{name}_hi"] = (tuple(v.shape), v.dtype)
        out[f"{nid}.{name}_lo"] = (tuple(v.shape), v.dtype)
    return out


def _cache_entries(program: Program, nid: str, form: str) -> dict[tuple, int]:
    """(parameter, form) -> bytes its cache holds (split_tf32._cached's keys: shared across calls)."""
    node = program.nodes[nid]
    if form == TF32X3_CAT:
        b = node.inputs[1]
        return {(b, "cat"): 3 * _rounded(program.values[b].nbytes)} if _is_param(program, b) else {}
    return {(v, "split"): 2 * _rounded(program.values[v].nbytes) for v in node.inputs[:2] if _is_param(program, v)}


def _nbytes(shape, dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * DTYPE_BYTES[dtype]


def plan_library_memory(program: Program, steps, kernel_values: dict[str, tuple[int, int, int]],
                        budget: int | None = None) -> LibraryMemory:
    """The arena of `steps` (program_runtime.steps) with library outputs and split temporaries in it,
    and the split-TF32 decisions. kernel_values: the kernel outputs' (nbytes, first step, last step)."""
    step_of = {n: i for i, s in enumerate(steps) for n in s.nodes}
    node_order = [n for s in steps for n in s.nodes]
    life = lifetimes(program, node_order)
    n_nodes = len(node_order)

    def step_life(vid: str) -> tuple[int, int]:
        start = step_of[program.producer(vid).id]
        lt = life.get(vid)
        end = len(steps) if lt is None or lt.end >= n_nodes else step_of[node_order[lt.end]]
        return start, max(start, end)

    base = dict(kernel_values)
    kinds = {v: "kernel output" for v in kernel_values}
    released: dict[str, tuple[int, int, int]] = {}     # torch values the pool holds: (nbytes, start, end)
    split_calls: list[str] = []
    precision = library_precision(program)
    for s in steps:
        nids = s.library_nodes if s.kind == "kernel" else ([] if s.view else s.nodes)
        for nid in nids:
            form = precision.get(nid)
            node = program.nodes[nid]
            if form in (TF32X3, TF32X3_CAT) and not (form == TF32X3_CAT and not can_concatenate(program, nid)):
                split_calls.append(nid)
            in_arena = writes_into_arena(program, nid) and (form in (None, "fp32") or
                                                            (form == TF32X3 and gemm_split(program, nid)))
            for v in node.outputs:
                if v in life and v not in base:
                    st, en = step_life(v)
                    if in_arena:
                        base[v] = (program.values[v].nbytes, st, en)
                        kinds[v] = "library output"
                    else:
                        released[v] = (_rounded(program.values[v].nbytes), st, en)
            if form in (TF32X3, TF32X3_CAT) and not in_arena and node.outputs:   # the three products summed
                o = node.outputs[0]
                released[f"{nid}.sum"] = (_rounded(program.values[o].nbytes), step_of[nid], step_of[nid])

    if budget is None and program.metadata.get("memory_budget_bytes") is not None:
        budget, source = int(program.metadata["memory_budget_bytes"]), "the program's memory_budget_bytes"
    elif budget is None:
        # unbounded unless asked: the split forms were chosen for speed (H200, 76_Gemm_Add_ReLU: with
        # eager's estimated peak as the budget its GEMM ran in fp32, 1.10 -> 2.72 ms)
        budget, source = 1 << 62, "no budget (the program's memory_budget_bytes sets one)"
    else:
        source = "given"

    def released_peak() -> int:
        delta = [0] * (len(steps) + 3)
        for nb, st, en in released.values():
            delta[st] += nb
            delta[en + 1] -= nb
        peak = live = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return peak
    pool_peak = released_peak()

    uncached: set[tuple] = set()          # (parameter, form) caches dropped
    demoted: set[str] = set()             # calls run in fp32

    def build():
        values = dict(base)
        temps: dict[str, tuple] = {}
        caches: dict[tuple, int] = {}
        for nid in split_calls:
            if nid in demoted:
                continue
            form = precision[nid]
            entries = _cache_entries(program, nid, form)
            cached = not any(k in uncached for k in entries)
            if cached:
                caches.update(entries)
            t = _split_temps(program, nid, form, cached)
            s = step_of[nid]
            for slot, spec in t.items():
                temps[slot] = spec
                values[slot] = (_nbytes(*spec), s, s)
        arena = plan_arena(values)
        return arena, temps, caches, arena.total_bytes + pool_peak + sum(caches.values())

    arena, temps, caches, predicted = build()
    # 1. drop the largest caches first while over the budget
    for key, nb in sorted(caches.items(), key=lambda kv: -kv[1]):
        if predicted <= budget:
            break
        uncached.add(key)
        arena, temps, caches, predicted = build()
    # 2. then run in fp32 the calls whose temporaries weigh most, while that lowers the peak
    def temp_bytes(nid):
        return sum(_nbytes(*spec) for slot, spec in temps.items() if slot.startswith(nid + "."))
    for nid in sorted(split_calls, key=lambda n: -temp_bytes(n)):
        if predicted <= budget:
            break
        demoted.add(nid)
        trial = build()
        if trial[3] <= predicted:      # equal: the peak may sit on another call that shares its bytes
            arena, temps, caches, predicted = trial
        else:
            demoted.discard(nid)

    decisions = {}
    mib = 1 << 20
    for nid in split_calls:
        form = precision[nid]
        entries = _cache_entries(program, nid, form)
        cache_nb = sum(entries.values())
        tb = temp_bytes(nid)
        within = f"predicted peak {predicted / mib:.1f} MiB, budget {budget / mib:.1f} MiB ({source})"
        if nid in demoted:
            decisions[nid] = MemoryDecision(nid, form, "fp32", "none", cache_nb, 0,
                                            f"runs in fp32: even split per call its temporaries "
                                            f"({_nbytes_split(program, nid, form) / mib:.1f} MiB) take the "
                                            f"peak above the budget; {within}")
        elif not entries:
            decisions[nid] = MemoryDecision(nid, form, form, "none", 0, tb,
                                            f"no parameter operand: both split per call into {tb / mib:.1f} MiB "
                                            f"of arena temporaries; {within}")
        elif any(k in uncached for k in entries):
            decisions[nid] = MemoryDecision(nid, form, form, "split per call", cache_nb, tb,
                                            f"weights split per call into arena temporaries "
                                            f"({tb / mib:.1f} MiB): caching them ({cache_nb / mib:.1f} MiB) "
                                            f"would take the peak above the budget; {within}")
        else:
            decisions[nid] = MemoryDecision(nid, form, form, "cached", cache_nb, tb,
                                            f"weights split once and cached ({cache_nb / mib:.1f} MiB): "
                                            f"within the budget; {within}")
    kinds.update({slot: "split temporary" for slot in temps})
    return LibraryMemory(arena, {v: kinds[v] for v in arena.slots}, temps, decisions, budget, source,
                         predicted, pool_peak, sum(caches.values()))


def _nbytes_split(program: Program, nid: str, form: str) -> int:
    return sum(_nbytes(*spec) for spec in _split_temps(program, nid, form, False).values())
