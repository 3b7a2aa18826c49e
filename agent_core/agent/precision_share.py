"""Library calls of one signature (op, attributes, operand shapes and dtypes) are timed once.

agent.precision times every matmul and convolution in each form it may run in. A model's repeated
blocks repeat these calls: the RNN's 512 matmuls are two shapes, ResNet101's 105 convolutions 24.
The same call on the same shapes takes the same time, so the first node of each signature is timed
and the others take its form. What the form's choice also rests on, agreement with fp32 at 1e-4 on a
random draw, depends on the operands' values (a node's own weights), so each other node still runs
fp32 and the chosen form once on its own tensors and compares them; one that disagrees is timed on
its own, as before. The end-to-end verification against the fp32 reference has the last word.
"""
from __future__ import annotations

import json

from ..ir import Program
from ..program_runtime.memory_plan import call_temp_bytes
from ..runtime.split_k import share_parts
from ..runtime.split_tf32 import library_layout
from ..verify import tolerance
from .precision import (CL, ERRORS_KEY, SPLIT_VARIANTS, choose_library_precision, library_nodes, over_room, variants,
                        workspace_bytes)


def call_signature(program: Program, nid: str) -> str:
    node = program.nodes[nid]
    specs = [(list(program.values[v].shape), program.values[v].dtype) if v else None for v in node.inputs]
    return json.dumps([node.op, node.attrs, specs], sort_keys=True, default=repr)


def groups(program: Program) -> list[list[str]]:
    """The eligible library nodes by signature, first-seen order; each group's first node is timed."""
    out: dict[str, list[str]] = {}
    for nid in library_nodes(program):
        out.setdefault(call_signature(program, nid), []).append(nid)
    return list(out.values())


def agrees(program: Program, nid: str, form: str, tensors_for) -> bool:
    """The node's result in `form` (precision.variants' key: a form, maybe "+channels_last") against
    fp32, on its own tensors (one run each, nothing timed)."""
    import torch
    from ..reference import run_node
    run = variants(program, nid).get(form)
    if run is None:
        return False
    node = program.nodes[nid]
    env = {v: t for v, t in zip(node.inputs, tensors_for([v for v in node.inputs if v])) if v}
    with torch.no_grad():
        want, got = dict(env), dict(env)
        run_node(program, nid, want)
        run(program, nid, got)
        out = node.outputs[0]
        atol, rtol = tolerance(program)
        return bool(torch.allclose(got[out], want[out], rtol=rtol, atol=atol))


def choose_shared_precision(program: Program, tensors_for, emit, trials: int,
                            room: dict[str, int] | None = None) -> dict[str, str]:
    """agent.precision.choose_library_precision, timing one node per signature. Same result shape:
    writes and returns program.metadata["library_precision"]. room: as there; a node shares a choice
    only when the same split forms fit in memory there as on the node it was timed on, and the chosen
    form's temporaries (as measured there) fit too."""
    grouped = groups(program)
    program.metadata.pop("library_layout", None)     # an earlier run's: every chain's layout is chosen again
    program.metadata.pop("library_precision_gain_ms", None)
    program.metadata.pop(ERRORS_KEY, None)
    program.metadata.pop("library_workspace_bytes", None)
    room = room or {}
    chosen = dict(choose_library_precision(program, tensors_for, emit, trials, nodes=[g[0] for g in grouped],
                                           room=room))
    layouts = dict(library_layout(program))
    workspace = dict(workspace_bytes(program))
    alone: list[str] = []
    for g in grouped:
        first = g[0]
        form, layout = chosen.get(first, "fp32"), layouts.get(first)
        key = form + (CL if layout else "")
        adds = call_temp_bytes(program, first, form, layout is not None) + workspace.get(first, 0)
        for nid in g[1:]:
            node = program.nodes[nid]
            if over_room(program, nid, SPLIT_VARIANTS, room.get(nid)) != \
                    over_room(program, first, SPLIT_VARIANTS, room.get(first)) or \
                    (room.get(nid) is not None and adds > room[nid]):
                alone.append(nid)          # other forms fit in memory here, or this one does not
                continue
            if key != "fp32":
                share_parts(program, first, nid)      # fp32-splitk: the same part count as where timed
                try:
                    ok = agrees(program, nid, key, tensors_for)
                except Exception:   # noqa: BLE001 - as precision does: this node is then timed alone
                    ok = False
                if not ok:
                    alone.append(nid)
                    continue
                if form != "fp32":
                    chosen[nid] = form
                    gains = program.metadata.setdefault("library_precision_gain_ms", {})
                    if first in gains:
                        gains[nid] = gains[first]
                if layout:
                    layouts[nid] = layout
                if first in workspace:
                    workspace[nid] = workspace[first]     # the same call: the same algorithm and workspace
            emit.emit("precision", node=nid, op=node.op, chosen=form, shared_with=first,
                      **({"layout": layout} if layout else {}),
                      reason=f"as {program.nodes[first].name} (the same call on the same shapes), timed there"
                             + ("; agrees with fp32 at 1e-4 on this node's own tensors" if key != "fp32" else ""))
    program.metadata["library_workspace_bytes"] = workspace
    if alone:
        program.metadata["library_layout"] = layouts    # the alone nodes' timing sees the chain's layouts
        chosen.update(choose_library_precision(program, tensors_for, emit, trials, nodes=alone, room=room))
        layouts.update(library_layout(program))
    program.metadata["library_precision"] = chosen
    program.metadata["library_layout"] = layouts
    return chosen
