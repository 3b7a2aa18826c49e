"""Per matmul / convolution node: how its library call runs (runtime.split_tf32): plain fp32, split TF32
on tensor cores (three calls summed, or for a convolution one call over channel-concatenated parts),
or (convolutions) fp32 with a cuDNN algorithm picked by timing. Every form is timed on the node's
shapes and must agree with fp32 at 1e-4 on the timing draw. The more accurate form wins unless a less
accurate one is clearly faster. The end-to-end verification against the fp32 reference has the last
word.

A memory-bound convolution (depthwise, small-channel or 1x1 over few channels: fewer FLOPs per byte
moved than fp32 itself keeps up with) is offered the fp32 forms only: a split form reads its operands
three times (or a three-times-wider input) to save arithmetic that was never the limit."""
from __future__ import annotations

from ..analysis.gpu import H200, GPUProfile
from ..codegen import LIBRARY_CATEGORIES
from ..ir import Program
from ..reference import run_node
from ..runtime.split_tf32 import (TF32X3, TF32X3_CAT, TIMED_FP32, can_concatenate, can_split, library_precision,
                                  run_split_tf32, run_split_tf32_cat, run_timed_fp32)

MIN_GAIN = 1.05   # below this the choice would follow timing noise
# the forms, most accurate first, and their event fields
FIELDS = {"fp32": "fp32_ms", TIMED_FP32: "timed_fp32_ms", TF32X3: "tf32x3_ms", TF32X3_CAT: "tf32x3_cat_ms"}


def library_nodes(program: Program) -> list[str]:
    return [n for n in program.topo_order()
            if program.nodes[n].opdef.category in LIBRARY_CATEGORIES and can_split(program, n)]


def intensity(program: Program, nid: str) -> float:
    """FLOPs per byte the node reads (operands, weights) and writes, at their own dtypes."""
    node = program.nodes[nid]
    moved = sum(program.values[v].nbytes for v in list(node.inputs) + list(node.outputs) if v)
    return program.node_flops(nid) / max(moved, 1)


def memory_bound(program: Program, nid: str, gpu: GPUProfile = H200) -> bool:
    """A convolution below fp32's ridge point (peak FLOP/s over copy bandwidth, about 12 FLOP/B on the
    H200): the time goes to moving bytes, which the split forms multiply."""
    return (program.nodes[nid].opdef.category == "convolution"
            and intensity(program, nid) < gpu.flops_per_ms / gpu.bytes_per_ms)


def candidates(program: Program, nid: str) -> list[str]:
    """The forms timed for this node, most accurate first."""
    return list(_forms(program, nid))


def _forms(program: Program, nid: str) -> dict:
    forms = {"fp32": run_node}
    if program.nodes[nid].opdef.category == "convolution":
        forms[TIMED_FP32] = run_timed_fp32
    if memory_bound(program, nid):
        return forms
    forms[TF32X3] = run_split_tf32
    if can_concatenate(program, nid):
        forms[TF32X3_CAT] = run_split_tf32_cat
    return forms


def pick(ms: dict[str, float], disagree) -> str:
    """The fastest form that agrees with fp32, unless a more accurate one is within MIN_GAIN of it."""
    fits = [m for m in FIELDS if m in ms and m not in disagree]
    fastest = min(fits, key=ms.get)
    return next(m for m in fits if ms[m] <= ms[fastest] * MIN_GAIN)


def choose_library_precision(program: Program, tensors_for, emit, trials: int, nodes=None) -> dict[str, str]:
    """Time every eligible node each way (or those in `nodes`); tensors_for(value ids) -> GPU tensors
    (parameters real). Writes and returns program.metadata["library_precision"] (node id -> its form,
    fp32 ones left out)."""
    import torch
    from .quick_timing import time_candidate
    chosen: dict[str, str] = {}
    for nid in (library_nodes(program) if nodes is None else nodes):
        node = program.nodes[nid]
        env = {v: t for v, t in zip(node.inputs, tensors_for([v for v in node.inputs if v])) if v}
        out = node.outputs[0]
        ms, disagree = {}, []
        try:
            with torch.no_grad():
                fp32 = None   # fp32's result; each other form's is compared with it and dropped
                for mode, run in _forms(program, nid).items():
                    result = dict(env)
                    run(program, nid, result)
                    if fp32 is None:
                        fp32 = result[out]
                    elif not torch.allclose(result[out], fp32, rtol=1e-4, atol=1e-4):
                        disagree.append(mode)
                    del result
                    against = min((t for m, t in ms.items() if m not in disagree), default=None)
                    ms[mode] = time_candidate(lambda: run(program, nid, dict(env)), trials=trials,
                                              best_ms=against)[0].median_ms   # clearly slower: stopped early
                del fp32
        except Exception as exc:  # noqa: BLE001 - a node that cannot be timed stays fp32
            emit.log(f"{node.name} ({node.op}): only fp32 tried: {type(exc).__name__}: {exc}",
                     level="warning", node=nid)
            continue
        best = pick(ms, disagree)
        why = (f"{ms['fp32'] / ms[best]:.2f}x faster than plain fp32 ({ms[best]:.3f} ms vs {ms['fp32']:.3f} ms)"
               if best != "fp32" else "no other form is faster")
        if disagree:
            why += "; " + ", ".join(disagree) + " disagreed with fp32 beyond 1e-4 on a random draw"
        if memory_bound(program, nid):
            why += (f"; memory-bound ({intensity(program, nid):.1f} FLOP/B, below fp32's ridge), "
                    f"so the split-TF32 forms were not tried")
        emit.emit("precision", node=nid, op=node.op, chosen=best, reason=why,
                  **{FIELDS[m]: t for m, t in ms.items()})
        if best != "fp32":
            chosen[nid] = best
    program.metadata["library_precision"] = chosen
    return chosen


def library_forms(program: Program) -> dict[str, dict]:
    """Every matmul and convolution the chooser considers, with the form it runs in (fp32 included)
    and why it was offered what it was: the bench record's view of the library calls."""
    chosen = library_precision(program)
    out = {}
    for nid in library_nodes(program):
        node = program.nodes[nid]
        entry = {"name": node.name, "op": node.op, "form": chosen.get(nid, "fp32"),
                 "flop_per_byte": round(intensity(program, nid), 2), "memory_bound": memory_bound(program, nid)}
        if node.opdef.category == "convolution":
            entry["groups"] = node.attrs.get("groups", 1)
        out[nid] = entry
    return out
