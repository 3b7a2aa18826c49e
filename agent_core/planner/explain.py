"""Turning a final group into a Region: its kind, schedule details, estimates and the reason a user
reads. Every number in a reason comes from the same cost model that ranked the fusion, and every
region says how it runs (schedule["runs"]): "kernel" (one generated kernel), "library+kernel" (a
cuBLAS / cuDNN call, then the generated epilogue kernel that reads its output back), "library" (the
call alone), "torch" (a node the generator has no kernel for, run through its torch implementation),
"alias" (views only, nothing runs) or "strided_view" (a slice or transpose only library calls read:
torch's view, nothing runs); schedule["launches"] counts them as the export does."""
from __future__ import annotations

from ..analysis.cost import TORCH_VIEWS, fmt_bytes, fmt_ms, library_reads_as_view, roofline_ms
from ..codegen.conv import lone_direct
from ..codegen.gemm_mma import FORM, lone_gemm
from ..codegen.lower_check import lowered_schedule
from ..regions import Region
from ..text import plural
from .attention import attention_node, attention_reason
from .fusion import (
    backend_refusal, full_space_inputs, group_bytes, group_time, launches, library_form_ms, library_ms, node_facts,
    rereads_rows, schedule_for, summarize, tile_gemm_ms, tile_gemm_work, traffic,
)

_OP_WORDS = 6  # name at most this many ops in a reason
# the row kernel's schedules (codegen/rowkernel.py) as the plan names them (regions.SCHEDULES)
GENERATED_MODES = {"warp": "warp-per-row", "block": "block-per-row", "stream": "streamed-row",
                   "cluster": "cluster-per-row", "split_row": "split-row", "column": "column-tiles",
                   "split_column": "column-tiles"}


def _names(state, nodes, limit=_OP_WORDS) -> str:
    ops = [state.program.nodes[n].op for n in nodes if state.geo[n].role != "view"]
    uniq = list(dict.fromkeys(ops))
    words = uniq[:limit] + ([f"{len(uniq) - limit} more"] if len(uniq) > limit else [])
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " and " + words[-1]


def _label(state, nid) -> str:
    n = state.program.nodes[nid]
    return n.op if n.name == n.op else f"{n.name}"


def _elems(n) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e4:
        return f"{n / 1e3:.0f}K"
    return str(n)


LIBRARY = {"matmul": "cuBLAS", "conv": "cuDNN"}


def _lone_gemm_reason(state, nid: str, role: str, after: float) -> str:
    """A matmul or convolution alone that the agent also times as our tile GEMM (gemm_mma.lone_gemm)."""
    if role != "conv":
        tile = tile_gemm_ms(state, [nid], nid)
        return (f"{_label(state, nid)} runs through cuBLAS, about {fmt_ms(library_ms(state, nid))} at the fp32 "
                f"roofline; it is compute-bound, so the agent also times it as our tile GEMM ({FORM}: split TF32 "
                f"on the tensor cores, split in registers, no parts written to memory"
                + (f", about {fmt_ms(tile)}" if tile is not None else "") + ") and keeps the faster.")
    from ..analysis.cost import node_cost
    why = ("it is compute-bound" if node_cost(state.program, nid).bound() == "compute" else
           "it reads few input channels, where cuDNN's fp32 is slow")
    return (f"{_label(state, nid)} runs through cuDNN, about {fmt_ms(after)} at the roofline; {why}, "
            f"so the agent also times it as one implicit-GEMM kernel ({FORM}: split TF32 "
            f"on the tensor cores, the input's patches gathered into shared memory) and keeps the faster."
            + _direct_conv_words(state, [nid]))


def kind_of(state, nodes, s, sibling: bool) -> str:
    if s.blocker and attention_node(state, nodes):
        return "attention"      # our fused attention kernel, not the library call
    if s.blocker:
        return "opaque" if state.geo[s.blocker].role == "opaque" else "single"
    if s.anchor or (s.window and not s.reductions):     # pools before reductions: the row kernel's prologue
        if len([n for n in nodes if state.geo[n].role != "view"]) == 1:
            return "single"
        if s.window:
            return "pooling"
        return "matmul_epilogue" if s.anchor_role == "matmul" else "conv_epilogue"
    if s.reductions:
        return "reduction"
    if s.layouts:
        return "layout"     # codegen's layout generator: a chain, or a graph of views and pointwise ops
    if s.ops <= 1:
        return "single"
    return "sibling" if sibling else "pointwise"


def lowering_refusal(state, nodes, s, escaping, sibling: bool = False) -> str | None:
    """Why codegen would not write the kernel of `nodes` (summary s, its values used outside `escaping`)
    as the planner would label the group, or None: a single node is a library call or its own kernel."""
    kind = kind_of(state, nodes, s, sibling)
    return None if kind == "single" else backend_refusal(state, nodes, escaping, kind)


def make_region(state, group, rid: str, refusals: dict[str, str], node_time, facts=None,
                backend_notes: dict | None = None) -> Region:
    nodes = state.sort_nodes(group.nodes)
    s = summarize(state, nodes)
    kind = kind_of(state, nodes, s, group.sibling)
    before = sum(node_time(n) for n in nodes)
    after, facts = group_time(state, nodes, s, facts)
    real = [n for n in nodes if not state.costs[n].view]
    runs = _runs(state, nodes, s, kind, facts)
    n_launches = launches(state, nodes, s.anchor) if runs != "torch" else len(real)
    anchored = runs == "library+kernel"
    # what stays on chip is what the generated kernel keeps: after a library call, the epilogue's own
    tr = traffic(state, [n for n in nodes if n != s.anchor] if anchored else nodes, None if anchored else facts)
    # each node alone as node_time costs it (a slice reads only the part it keeps)
    unfused_bytes = sum(f.read_bytes + f.esc_bytes for f in (node_facts(state, n) for n in nodes))
    saved_bytes = unfused_bytes - group_bytes(state, nodes, s.anchor, facts)
    saved_ms = before - after
    saving = (f"saves {plural(max(len(real) - n_launches, 0), 'launch')} and "
              f"{fmt_bytes(max(saved_bytes, 0))} of traffic, about {fmt_ms(max(saved_ms, 0))}")
    if len(real) - n_launches <= 0 and saved_bytes <= 0:
        saving = "no saving over running them apart (an epilogue kernel runs after the library call either way)" \
            if anchored else "no saving over running them apart"
    kept = ""
    if tr.kept_values:
        big = max(tr.kept_values, key=lambda v: state.program.values[v].nbytes)
        producer = state.program.values[big].producer
        kept = (f"keeps the {fmt_bytes(state.program.values[big].nbytes)} output of {_label(state, producer)}"
                + (f" and {plural(len(tr.kept_values) - 1, 'other intermediate')}"
                   if len(tr.kept_values) > 1 else "") + " on chip; ")
    sched: dict = {}
    if kind == "reduction":
        red = s.red
        k = full_space_inputs(state, nodes, red)
        mode, held = schedule_for(red, k, state.gpu)
        # the kernel codegen writes decides the words: a row whose results need no second pass streams
        # through one block (a loss, a log-sum-exp), whatever its length
        gen = lowered_schedule(state.program, nodes, kind)
        mode = GENERATED_MODES.get((gen or {}).get("schedule"), mode)
        reads = (gen or {}).get("row_reads") or 1
        sched = {"anchor": s.reductions[0], "reductions": list(s.reductions), "rows": red.rows,
                 "row_len": red.row_len, "schedule": mode,
                 "layout": "contiguous" if red.contiguous else "strided", "full_shape": list(red.full)}
        why_sched = {"column-tiles": f"column tiles (each row's {red.row_len} elements lie a stride apart: "
                                     f"threads take neighbouring rows, so each load is coalesced across them)",
                     "warp-per-row": f"one warp per row (a {fmt_bytes(red.row_len * 4)} row fits in registers)",
                     "block-per-row": f"one block per row (a {fmt_bytes(red.row_len * 4 * max(k, 1))} row "
                                      f"fits on chip)",
                     "cluster-per-row": f"a thread-block cluster per row (a {fmt_bytes(red.row_len * 4 * max(k, 1))} "
                                        f"row fits in the registers of up to 8 CTAs; one read)" if reads == 1 else
                                        f"a thread-block cluster of {gen['cluster']} CTAs per row, each reading its "
                                        f"share of the {fmt_bytes(red.row_len * 4 * max(k, 1))} row {reads} times "
                                        f"(more than its threads hold in registers; the re-reads mostly hit L2)",
                     "streamed-row": f"one block per row streaming the {fmt_bytes(red.row_len * 4 * max(k, 1))} row "
                                     + ("once (nothing per element needs the row's results back)" if reads == 1 else
                                        f"{reads} times from memory (once per reduction round, then for the outputs: it exceeds "
                                        f"the {state.gpu.block_row_bytes // 1024} KiB a block holds on chip)"),
                     "split-row": f"each of the {red.rows} rows in chunks over the whole GPU (fewer rows than "
                                  f"two per SM), " + ("each chunk held in the registers of one block, which waits "
                                                      "for its row's combined state after each round: the row is "
                                                      "read once" if (gen or {}).get("held", bool(held)) else
                                                      f"streamed {reads} times (once per reduction round, then "
                                                      f"for the outputs)" if reads > 1 else "streamed once"),
                     "two-pass": (f"two passes over memory (a {fmt_bytes(red.row_len * 4 * max(k, 1))} row "
                                  f"exceeds the {state.gpu.block_row_bytes // 1024} KiB on-chip budget)"
                                  if rereads_rows(state, nodes, red) else
                                  f"blocks reduce slices of each {fmt_bytes(red.row_len * 4)} row and a "
                                  f"second small pass combines their partial results")}[mode]
        rows = (f"all {red.row_len} elements" if red.rows == 1 else f"{red.rows} rows of {red.row_len}")
        if len(real) <= 1:
            reason = f"{_names(state, nodes)} over {rows} in one kernel, {why_sched}; about {fmt_ms(after)} at the roofline."
        else:
            reason = f"stitches {_names(state, nodes)} over {rows}, {why_sched}; {kept}{saving}."
        if s.windows:
            resampled = all(state.program.nodes[w].op.startswith("upsample_") for w in s.windows)
            how, what = ("interpolated from the inputs around it", "resampled") if resampled else \
                ("pooled from its window", "pooled")
            if all(state.geo[w].role == "reduction" for w in s.windows):     # codegen/reduce_window.py
                staged = (gen or {}).get("staged_windows")
                reason += (f" Each element of the rows is the {_names(state, s.windows)} over its own window of "
                           f"{state.geo[s.windows[0]].row_len}, " +
                           ("and the windows are contiguous: each block first reads its rows' windows in "
                            "coalesced chunks into shared memory and folds them there" if staged else
                            "folded as it is read") + "; that result never goes to memory.")
            else:
                reason += (f" Each element of the rows is {how} as it is read ({_names(state, s.windows)}): the "
                           f"{what} map never goes to memory.")
        guarded, rows_skipped = (gen or {}).get("guarded") or [], (gen or {}).get("guarded_rows") or []
        if guarded:
            sched["guarded"] = guarded
            reason += (f" {' and '.join(repr(n) for n in guarded)} {'is' if len(guarded) == 1 else 'are'} read "
                       f"only where the where selects {'it' if len(guarded) == 1 else 'them'}; masked-out "
                       f"elements are never loaded.")
        if rows_skipped:
            sched["guarded_rows"] = rows_skipped
            reason += (f" A row whose result is discarded (an ignored label) never loads "
                       f"{' or '.join(repr(n) for n in rows_skipped)}.")
    elif kind in ("matmul_epilogue", "conv_epilogue"):
        an = s.anchor
        epi = [n for n in nodes if n != an]
        out = state.program.values[state.program.nodes[an].outputs[0]]
        sched = {"anchor": an, "epilogue": epi}
        row = ""
        if s.reductions:
            sched.update({"row_reduction": True, "reductions": list(s.reductions), "rows": s.red.rows,
                          "row_len": s.red.row_len})
            row = f" and reduces its {plural(s.red.rows, 'row')} of {s.red.row_len}"
        lib = LIBRARY[s.anchor_role]
        reason = (f"{lib} + epilogue kernel ({plural(n_launches, 'launch')}): "
                  f"{_label(state, an)} runs through {lib} and writes its {fmt_bytes(out.nbytes)} output; "
                  f"one generated kernel reads it back, applies {_names(state, epi)}{row}; {kept}{saving}.")
        # the other form the agent times against this one (agent/gemm_form.py)
        reason += _tile_gemm_form(state, nodes, epi, out, s, sched, facts, conv=kind == "conv_epilogue")
        reason += _direct_conv_words(state, nodes)
    elif kind == "pooling":
        wins = s.windows
        first, last = nodes.index(wins[0]), nodes.index(wins[-1])   # execution order: the prologue feeds them
        ops = [n for n in nodes if n not in wins and state.geo[n].role != "view"]
        prologue = [n for n in ops if nodes.index(n) < first]
        epilogue = [n for n in ops if nodes.index(n) > last]
        between = [n for n in ops if first < nodes.index(n) < last]
        sched = {"anchor": wins[0], "windows": list(wins), "prologue": prologue, "epilogue": epilogue}
        head = _label(state, wins[0]) if len(wins) == 1 else (
            f"{', '.join(_label(state, w) for w in wins)} in one pass, each pooled element computed from its "
            f"window where it is needed (a pool of a pool reads the first one's windows, not a map in memory)"
            + (f", {_names(state, between)} between them" if between else ""))
        parts = ([f"applies {_names(state, prologue)} to each element a window reads"] if prologue else []) + \
                ([f"applies {_names(state, epilogue)} to each pooled element before its only store"] if epilogue else [])
        reason = f"pooling kernel: {' '.join([head, ' and '.join(parts)]).strip()}; {kept}{saving}."
    elif kind == "attention":
        sched, reason, after = attention_reason(state, nodes, facts)
    elif kind == "layout":
        sched, reason = _layout_reason(state, nodes, s, facts, refusals, after, f"{kept}{saving}",
                                       bool(_backend_note(state, nodes, backend_notes)))
    elif kind in ("pointwise", "sibling"):
        numel = max(s.numels.values(), default=0)
        sched = {"numel": numel, "shape": list(state.geo[max(s.numels, key=s.numels.get)].shape)
                 if s.numels else []}
        if kind == "sibling":
            shared = _shared_inputs(state, group.nodes)
            sched["shared_inputs"] = shared
            what = (f"reads {', '.join(state.program.values[v].name for v in shared[:3])} once for "
                    if shared else "runs ")
            reason = f"{what}{_names(state, nodes)} over the same {_elems(numel)}-element loop; {kept}{saving}."
        else:
            reason = f"fuses {_names(state, nodes)} over {_elems(numel)} elements into one kernel; {kept}{saving}."
    else:
        nid = next((n for n in nodes if state.geo[n].role != "view"), nodes[0])
        alias = all(state.geo[n].role == "view" for n in nodes)
        sched = {"op": state.program.nodes[nid].op, "alias": alias}
        role = state.geo[nid].role
        if alias:
            reason = f"{_label(state, nid)} only relabels its input's shape; no kernel, no traffic."
        elif runs == "library" and lone_gemm(state.program, [nid]):
            reason = _lone_gemm_reason(state, nid, role, after)
        elif runs == "library" and lone_direct(state.program, [nid]):
            reason = (f"{_label(state, nid)} runs through cuDNN, about {fmt_ms(after)} at the roofline, but cuDNN's "
                      f"fp32 runs transposed convolutions far below the FMA units' peak."
                      + _direct_conv_words(state, [nid]))
        elif runs == "library":
            reason = (f"{_label(state, nid)} runs through {LIBRARY.get(role, 'the library (torch)')} (a library "
                      f"call, no generated kernel); "
                      f"about {fmt_ms(after)} at the roofline.")
        elif role in ("single", "window", "opaque"):
            what = {"window": "a windowed pooling", "opaque": "an opaque call the planner cannot see into",
                    }.get(role, "a layout change")
            how = "its own generated kernel" if runs == "kernel" else "its own kernel"
            reason = f"{_label(state, nid)} is {what} and runs as {how}; about {fmt_ms(after)} at the roofline."
        else:
            why = refusals.get(nid) or "no neighbour it could share a loop with"
            reason = f"{_label(state, nid)} runs alone: {why}; about {fmt_ms(after)} at the roofline."
    if runs == "strided_view":
        nid = real[0]
        after, n_launches = 0.0, 0
        sched = {"op": state.program.nodes[nid].op, "alias": True}
        reason = (f"{_label(state, nid)} runs through torch as a strided view of its input: only library calls "
                  f"read it, and cuBLAS / cuDNN take it as it is, so no kernel copies it.")
    if runs == "torch":
        # the generator's own refusal: the region is the node(s) run through torch, as the agent will
        kind = "single" if kind not in ("opaque",) else kind
        sched = {"op": state.program.nodes[real[0]].op, "alias": False}
        reason = (f"{_label(state, real[0])} runs through torch: {runs_why(state, nodes, s, facts)}; about "
                  f"{fmt_ms(after)} at the roofline.")
    sched["runs"] = runs
    sched["launches"] = n_launches
    unfused = _backend_note(state, nodes, backend_notes)
    if unfused:
        reason = f"{reason} {unfused}"
    r = Region(rid, kind, nodes, status="proposed", reason=reason, est_before_ms=round(before, 6),
               est_after_ms=round(after, 6), schedule=sched)
    return r


def _direct_conv_words(state, nodes) -> str:
    """The words for a convolution whose short reduction has the agent time the direct one too."""
    from ..codegen.conv import CONV_OPS, direct_alternative, row_stride, thread_outputs
    from ..codegen.region_io import region_io
    alt = direct_alternative(state.program, region_io(state.program, nodes))
    if not alt:
        return ""
    conv = state.program.nodes[next(n for n in nodes if state.program.nodes[n].op in CONV_OPS)]
    per = thread_outputs(alt[0].get("positions_per_thread", 1), row_stride(state.program, conv))
    short = "Its reduction per output element is short"
    if conv.op.startswith("conv_transpose"):
        per += " of one phase: outputs whose positions share a residue modulo the stride read the same taps"
        short += " within a phase"
    return (f" {short}, so the direct convolution (fp32 FFMA, one thread per {per}"
            f"{', the epilogue fused' if len(nodes) > 1 else ''}) is timed too, with its weights "
            f"staged in shared memory and without; the fastest form is kept.")


def _tile_gemm_form(state, nodes, epi, out, s, sched, facts, conv: bool = False) -> str:
    """The tile GEMM as the other form of a matmul or convolution + epilogue region (a convolution's as
    an implicit GEMM): whether codegen takes it, and its roofline estimate from the bytes and FLOPs of
    the very kernel it generates first (gemm_mma.estimate); the words that say so."""
    from ..codegen.gemm_mma import gemm_supported
    from ..codegen.gemm_rows import NORMS
    why_not = gemm_supported(state.program, nodes)
    sched["forms"] = {"library+kernel": None, FORM: why_not}
    work = tile_gemm_work(state, nodes)
    if why_not is not None or isinstance(work, Exception):
        return ""
    nbytes, flops = work
    ms = tile_gemm_ms(state, nodes, s.anchor)
    if ms is None:      # a convolution's implicit GEMM, its rate not measured: costed at the fp32 peak
        ms = roofline_ms(nbytes, flops, gpu=state.gpu, graph=state.graph)
    after = library_form_ms(state, nodes, s.anchor, s.red)     # the two launches it is timed against
    sched["forms_est_ms"] = {"library+kernel": round(after, 6), FORM: round(ms, 6)}
    stored = any(state.program.values[v].nbytes == out.nbytes for v in facts.escaping)
    norms = [n for n in s.reductions if state.program.nodes[n].op in NORMS]
    pw = [n for n in epi if n not in s.reductions and state.geo[n].role != "view"]   # views: no words
    if norms:
        what = (f"{_names(state, pw) + ' applied and ' if pw else ''}its {plural(s.red.rows, 'row')} normalised "
                f"({_names(state, s.reductions)}) in the kernel (each CTA holds whole rows: their statistics, "
                f"then a second pass over its accumulators)")
        trip = f"the {fmt_bytes(out.nbytes)} output never makes the round trip"
    elif s.reductions:
        what = (f"{_names(state, pw) + ' applied and ' if pw else ''}its {plural(s.red.rows, 'row')} reduced "
                f"({_names(state, s.reductions)}) in the kernel (the CTAs of a row combine their partial states "
                f"in its last CTA)")
        trip = ("the " + fmt_bytes(out.nbytes) + " output never makes the round trip"
                + ("" if stored else " and is not written at all"))
    else:
        what = f"{_names(state, epi)} applied before the only store"
        trip = f"the {fmt_bytes(out.nbytes)} output never makes the round trip"
    kernel = (f"implicit-GEMM kernel ({FORM}, the input's patches gathered into shared memory, never written "
              f"out)") if conv else f"tile-GEMM kernel ({FORM})"
    return (f" The agent also times it as one {kernel}: split TF32 done in registers, {what}, "
            f"so {trip}; about {fmt_ms(ms)} at the roofline ({fmt_bytes(nbytes)} moved) against "
            f"{fmt_ms(after)} for the two launches.")


def _layout_reason(state, nodes, s, facts, refusals, after, saving, noted) -> tuple[dict, str]:
    """(schedule, reason) of a layout-graph region: its loop is its outputs, whatever its ops' sizes.
    noted: the generator's refusal of a neighbour is appended after the reason (not repeated here)."""
    vnumel = state.vnumel
    out = max(facts.escaping, key=vnumel.__getitem__, default=None)
    numel = vnumel[out] if out is not None else max(s.layouts.values())
    lay_ops = list(dict.fromkeys(state.program.nodes[n].op for n in s.layouts))
    sched = {"numel": numel, "shape": list(state.program.values[out].shape) if out is not None else [],
             "layout_ops": lay_ops}
    real = [n for n in nodes if state.geo[n].role != "view"]
    if len(real) > 1:
        return sched, (f"stitches {_names(state, nodes)} over {_elems(numel)} elements into one kernel: each "
                       f"output element reads the inputs through the views of the {_words(lay_ops)}, and "
                       f"nothing in between goes to memory; {saving}.")
    nid = real[0]
    op = state.program.nodes[nid].op
    why = "" if noted else f": {refusals.get(nid) or 'no neighbour it could share a loop with'}"
    free = (f"eager torch makes a {op} a strided view for free, so this copy pays only where a "
            f"generated consumer would copy it anyway; " if op in TORCH_VIEWS else "")
    return sched, (f"{_label(state, nid)} is a layout change and runs as its own generated kernel{why}; "
                   f"{free}about {fmt_ms(after)} at the roofline.")


def _words(words) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _runs(state, nodes, s, kind, facts) -> str:
    """How the group runs (see the module docstring); asks the generator where a kernel is expected."""
    real = [n for n in nodes if not state.costs[n].view]
    if not real:
        return "alias"
    if len(real) == 1 and library_reads_as_view(state.program, real[0]):
        return "strided_view"
    if kind == "attention":
        return "torch" if runs_why(state, nodes, s, facts) else "kernel"
    if len(real) == 1 and (s.anchor or state.program.nodes[real[0]].opdef.category in ("matmul", "convolution")):
        return "library"       # a lone matmul / convolution (attention, einsum too) runs through torch's library
    if kind == "opaque":
        return "torch"
    return "torch" if runs_why(state, nodes, s, facts) else ("library+kernel" if s.anchor else "kernel")


def runs_why(state, nodes, s, facts) -> str | None:
    """The generator's refusal of the group's kernel, or None (cached in codegen.can_lower)."""
    kind = kind_of(state, nodes, s, False)
    if kind == "opaque":
        return "an opaque call has no generated kernel"
    why = backend_refusal(state, nodes, facts.escaping, kind)
    return None if why is None else why.replace("the generator has no kernel for them together",
                                                "the generator has no kernel for it")


def _backend_note(state, nodes, notes) -> str:
    """'Not fused with X: the generator ...' for the first neighbour codegen kept this group apart from."""
    if not notes:
        return ""
    members = set(nodes)
    for n in nodes:
        hit = notes.get(n)
        if hit and hit[0] not in members:
            return f"Not fused with {_label(state, hit[0])}: {hit[1]}."
    return ""


def _shared_inputs(state, nodes) -> list[str]:
    members = set(nodes)
    readers: dict[str, set] = {}
    for nid in nodes:
        for v in state.program.nodes[nid].inputs:
            if v is not None and state.program.values[v].producer not in members:
                readers.setdefault(v, set()).add(nid)
    shared = [v for v, rs in readers.items() if len(rs) > 1]
    return sorted(shared, key=lambda v: -state.program.values[v].nbytes)
