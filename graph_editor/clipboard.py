"""Copy and paste of a selection as JSON (on the system clipboard as a custom type and as text, so it
works between windows and through a text editor).

What a pasted node reads: values made by copied nodes map to the pasted copies; program inputs and
intermediate values are reused when the target program has the same value (same id, shape, dtype:
pasting into the same document); parameters are always copied (a duplicated linear gets its own
weights); anything else is left unconnected.
"""
from __future__ import annotations

import json

import numpy as np

from agent_core.errors import StitchError
from agent_core.ir import Program, Role

from . import commands as C

FORMAT = "stitchcuda-clip"
MIME = "application/x-stitchcuda-clip"
MAX_INLINE = 1 << 16   # parameter elements copied with their data; larger ones are drawn at random


class ClipError(StitchError):
    pass


def copy_nodes(program: Program, node_ids) -> dict:
    ids = set(node_ids)
    order = [n for n in program.topo_order() if n in ids] if not program._has_cycle(program.graph()) \
        else [n for n in program.nodes if n in ids]
    values, nodes, skipped = {}, [], []
    for nid in order:
        n = program.nodes[nid]
        for vid in n.inputs:
            v = program.values.get(vid) if vid else None
            if v is None or v.producer in ids or vid in values:
                continue
            entry = {"id": v.id, "name": v.name, "shape": list(v.shape), "dtype": v.dtype, "role": v.role.value}
            data = program.data.get(vid)
            if data is not None:
                if data.size <= MAX_INLINE:
                    entry["data"] = np.asarray(data).tolist()
                else:
                    skipped.append(v.name)
            values[vid] = entry
        nodes.append({"id": nid, "op": n.op, "name": n.name, "attrs": n.attrs, "inputs": list(n.inputs),
                      "outputs": list(n.outputs), "pos": list(n.pos) if n.pos else None})
    return {"format": FORMAT, "version": 1, "nodes": nodes, "values": list(values.values()),
            "data_skipped": skipped}


def dumps(clip: dict) -> str:
    return json.dumps(clip, indent=1)


def loads(text: str) -> dict:
    try:
        clip = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise ClipError(f"the clipboard does not hold nodes (not JSON: {e})") from None
    if not isinstance(clip, dict) or clip.get("format") != FORMAT:
        raise ClipError("the clipboard holds JSON but not copied nodes (no \"format\": \"stitchcuda-clip\")")
    if not isinstance(clip.get("nodes"), list) or not isinstance(clip.get("values", []), list):
        raise ClipError("copied nodes are malformed: 'nodes' and 'values' must be lists")
    return clip


def paste(stack, program: Program, clip: dict, offset=(40.0, 40.0), at=None) -> list[str]:
    """Add the clip's nodes as one undo step; returns the new node ids."""
    nodes = clip["nodes"]
    if not nodes:
        return []
    if at is not None:  # place the clip's top-left corner at `at`
        xs = [n["pos"] for n in nodes if n.get("pos")]
        if xs:
            offset = (at[0] - min(p[0] for p in xs), at[1] - min(p[1] for p in xs))
    mapping: dict[str, str | None] = {}
    new_ids = []
    with C.macro(stack, f"Paste {len(nodes)} node{'s' * (len(nodes) > 1)}"):
        for v in clip.get("values", []):
            mapping[v["id"]] = _source_for(stack, program, v)
        for n in nodes:
            ins = [mapping.get(vid) if vid else None for vid in n["inputs"]]
            pos = n.get("pos") or (0.0, 0.0)
            cmd = C.AddNode(program, n["op"], ins, n.get("attrs") or {},
                            pos=(pos[0] + offset[0], pos[1] + offset[1]), name=program.unique_name(n["name"]))
            stack.push(cmd)
            node = program.nodes[cmd.node_id]
            for old, new in zip(n.get("outputs", []), node.outputs):
                mapping[old] = new
            new_ids.append(cmd.node_id)
    return new_ids


def _source_for(stack, program: Program, v: dict) -> str | None:
    role = Role(v.get("role", "intermediate"))
    here = program.values.get(v["id"])
    same = here is not None and list(here.shape) == list(v["shape"]) and here.dtype == v["dtype"]
    if role in (Role.PARAMETER, Role.CONSTANT):
        data = np.asarray(v["data"], dtype=v["dtype"]) if "data" in v else None
        if data is None and same and v["id"] in program.data:
            data = program.data[v["id"]].copy()
        cmd = C.AddInput(program, v["name"], v["shape"], v["dtype"], role=role, data=data)
        stack.push(cmd)
        return cmd.value_id
    if same:
        return v["id"]
    if role == Role.INPUT:
        cmd = C.AddInput(program, v["name"], v["shape"], v["dtype"])
        stack.push(cmd)
        return cmd.value_id
    return None
