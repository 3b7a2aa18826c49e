"""Per matmul / convolution node: how its library call runs (runtime.split_tf32): plain fp32, split TF32
on tensor cores (three calls summed, or for a convolution one call over channel-concatenated parts),
or (convolutions) fp32 with a cuDNN algorithm picked by timing. Every form is timed on the node's
shapes and must agree with fp32 at 1e-4 on the timing draw. The more accurate form wins unless a less
accurate one is clearly faster. The end-to-end verification against the fp32 reference has the last
word."""
from __future__ import annotations

from ..codegen import LIBRARY_CATEGORIES
from ..ir import Program
from ..reference import run_node
from ..runtime.split_tf32 import (TF32X3, TF32X3_CAT, TIMED_FP32, can_concatenate, can_split, run_split_tf32,
                                  run_split_tf32_cat, run_timed_fp32)

MIN_GAIN = 1.05   # below this the choice would follow timing noise
# the forms, most accurate first, and their event fields
FIELDS = {"fp32": "fp32_ms", TIMED_FP32: "timed_fp32_ms", TF32X3: "tf32x3_ms", TF32X3_CAT: "tf32x3_cat_ms"}


def library_nodes(program: Program) -> list[str]:
    return [n for n in program.topo_order()
            if program.nodes[n].opdef.category in LIBRARY_CATEGORIES and can_split(program, n)]


def _forms(program: Program, nid: str) -> dict:
    forms = {"fp32": run_node}
    if program.nodes[nid].opdef.category == "convolution":
        forms[TIMED_FP32] = run_timed_fp32
    forms[TF32X3] = run_split_tf32
    if can_concatenate(program, nid):
        forms[TF32X3_CAT] = run_split_tf32_cat
    return forms


def pick(ms: dict[str, float], disagree) -> str:
    """The fastest form that agrees with fp32, unless a more accurate one is within MIN_GAIN of it."""
    fits = [m for m in FIELDS if m in ms and m not in disagree]
    fastest = min(fits, key=ms.get)
    return next(m for m in fits if ms[m] <= ms[fastest] * MIN_GAIN)


def choose_library_precision(program: Program, tensors_for, emit, trials: int) -> dict[str, str]:
    """Time every eligible node each way; tensors_for(value ids) -> GPU tensors (parameters real).
    Writes and returns program.metadata["library_precision"] (node id -> its form, fp32 ones left out)."""
    import torch
    from ..profile.timing import time_in_graph
    chosen: dict[str, str] = {}
    for nid in library_nodes(program):
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
                    ms[mode] = time_in_graph(lambda: run(program, nid, dict(env)), trials=trials)[0].median_ms
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
        emit.emit("precision", node=nid, op=node.op, chosen=best, reason=why,
                  **{FIELDS[m]: t for m, t in ms.items()})
        if best != "fp32":
            chosen[nid] = best
    program.metadata["library_precision"] = chosen
    return chosen
