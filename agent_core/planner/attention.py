"""How the planner groups, labels and costs a scaled_dot_product_attention node that our fused attention
kernel takes (codegen/attention.py): one kernel that reads q, k, v and the mask once, in place through
the views that shape them, and writes the output once, 4 B H L S D flops (half when causal).

absorb_views runs before fusion: the pure views feeding the node's q, k, v and mask (a linear's
x.view(B, T, H, D).transpose(1, 2), the chunk / split of a fused qkv projection, a permute, GQA's
expand of kv heads) join its group, so they cost no copy kernel of their own; the kernel folds them
into its strided reads. A view with another consumer stays outside (a pure relabelling such as a
reshape is free there anyway, an alias region; a transpose the other consumer needs is copied for it
and the attention reads that copy). The generator is asked for each view it takes (can_lower), so the
group always generates."""
from __future__ import annotations

import math

from ..analysis.cost import fmt_bytes, fmt_ms

SDPA = "scaled_dot_product_attention"
# ops whose output is its one input read through shape + strides + offset (codegen/views.py): the
# attention kernel reads through them; codegen has the last word on each (a reshape of a permuted
# view may not be one strided view)
STRIDED_VIEWS = frozenset({"reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous",
                           "permute", "transpose", "expand", "slice", "select", "split", "chunk", "unbind"})


def _reads_through(state, nid: str) -> bool:
    n = state.program.nodes[nid]
    return state.costs[nid].view or (n.op in STRIDED_VIEWS and sum(v is not None for v in n.inputs) == 1)


def attention_node(state, nodes) -> str | None:
    """The SDPA node of a group our attention kernel runs: the group's only node that is no strided
    view, accepted by attention_supported; else None."""
    from ..codegen.attention import attention_supported
    real = [n for n in nodes if not _reads_through(state, n)]
    if len(real) != 1 or state.program.nodes[real[0]].op != SDPA:
        return None
    return real[0] if attention_supported(state.program, real[0]) is None else None


def absorb_views(state, note) -> int:
    """Merge into each lone SDPA group the strided views that feed only it (transitively); returns how
    many views were taken. note(action, nodes, message) logs each group made and each view refused."""
    from ..codegen import can_lower
    from ..codegen.attention import attention_supported
    program, taken = state.program, 0
    for nid in list(state.order_nodes):
        if program.nodes[nid].op != SDPA or attention_supported(program, nid) is not None:
            continue
        gid = state.group_of[nid]
        if state.groups[gid].frozen is not None or len(state.groups[gid].nodes) != 1:
            continue
        members, refused = {nid}, set()
        out = list(program.nodes[nid].outputs[:1])
        grew = True
        while grew:
            grew = False
            for p in _candidates(state, members, refused):
                why = can_lower(program, state.sort_nodes(members | {p}), "attention", outputs=out)
                if why is not None:
                    refused.add(p)
                    note("refused", [p, nid], f"the attention kernel does not read through "
                         f"{program.nodes[p].name} ({program.nodes[p].op}): {why}")
                    continue
                a = state.group_of[p]
                if state.cycle_path(a, gid) is not None:    # cannot happen for a view only the group reads
                    refused.add(p)
                    continue
                gid = state.merge(a, gid)
                members.add(p)
                taken += 1
                grew = True
        before = set(members)
        gid, after = _absorb_store_views(state, note, nid, gid, members)
        taken += len(after)
        if len(members) > 1:
            g = state.groups[gid]       # the attention node first: refusals name a group by its first node
            g.nodes = [nid] + [n for n in g.nodes if n != nid]
            names = ", ".join(program.nodes[n].name for n in state.sort_nodes(before - {nid}))
            said = [f"reads its operands through {names} in place"] if names else []
            if after:
                said.append("stores its output through " + ", ".join(program.nodes[n].name for n in after))
            note("fused", state.sort_nodes(members),
                 f"{program.nodes[nid].name} {' and '.join(said)} (no copy kernel)")
    return taken


def _absorb_store_views(state, note, nid: str, gid: int, members: set) -> tuple[int, list[str]]:
    """The chain of reshapes and permutes read only from the attention's output (each the only reader
    of the one before) joins its group, while the generator can store through it
    (codegen/attention_store.py); returns (group, the views taken in order)."""
    from ..codegen import can_lower
    from ..codegen.attention_store import STORE_VIEWS
    program, taken = state.program, []
    tail = program.nodes[nid].outputs[0]
    while tail not in state.outputs:
        readers = list(dict.fromkeys(state.consumers.get(tail, ())))
        if len(readers) != 1:
            break
        c = readers[0]
        n = program.nodes[c]
        g = state.groups[state.group_of[c]]
        if n.op not in STORE_VIEWS or [v for v in n.inputs if v is not None] != [tail] or len(n.outputs) != 1 \
                or g.frozen is not None or len(g.nodes) != 1:
            break
        why = can_lower(program, state.sort_nodes(members | {c}), "attention", outputs=[n.outputs[0]])
        if why is not None:
            note("refused", [nid, c], f"the attention kernel does not store through {n.name} ({n.op}): {why}")
            break
        if state.cycle_path(gid, state.group_of[c]) is not None:
            break
        gid = state.merge(gid, state.group_of[c])
        members.add(c)
        taken.append(c)
        tail = n.outputs[0]
    return gid, taken


def _candidates(state, members: set, refused: set) -> list[str]:
    """Producers of the group's inputs that are strided views read by nothing but the group, each
    still alone in its own group (not kept by the user)."""
    program, consumers, outputs = state.program, state.consumers, state.outputs
    found = []
    for m in state.sort_nodes(members):
        for vid in program.nodes[m].inputs:
            p = program.values[vid].producer if vid is not None else None
            if p is None or p in members or p in refused or p in found or not _reads_through(state, p):
                continue
            g = state.groups[state.group_of[p]]
            if g.frozen is not None or len(g.nodes) != 1:
                continue
            outs = program.nodes[p].outputs
            if any(v in outputs or not set(consumers.get(v, ())) <= members for v in outs):
                continue
            found.append(p)
    return found


def attention_estimate(state, nid: str, facts=None) -> tuple[float, int, int]:
    """(roofline ms, bytes, flops) of the fused kernel for SDPA node nid: with the group's facts, the
    bytes it reads from outside (through its views) and writes."""
    program, gpu = state.program, state.gpu
    node = program.nodes[nid]
    vals = program.values
    q, k, v = (vals[x] for x in node.inputs[:3])
    if facts is not None:
        nbytes = facts.read_bytes + facts.esc_bytes
    else:
        nbytes = sum(vals[x].nbytes for x in node.inputs if x) + vals[node.outputs[0]].nbytes
    out = vals[node.outputs[0]]
    batch = math.prod(out.shape[:-2])
    flops = 2 * batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if node.attrs.get("is_causal"):
        flops //= 2
    return gpu.launch_ms(state.graph) + max(nbytes / gpu.bytes_per_ms, flops / gpu.flops_per_ms), nbytes, flops


def attention_reason(state, nodes, facts=None) -> tuple[dict, str, float]:
    """(schedule, reason, estimated ms) of an attention region (its SDPA node and the views it reads
    through)."""
    from ..codegen.attention_parts import score_words
    nid = attention_node(state, nodes)
    ms, nbytes, flops = attention_estimate(state, nid, facts)
    program = state.program
    node = program.nodes[nid]
    q = program.values[node.inputs[0]]
    k = program.values[node.inputs[1]]
    mask = len(node.inputs) > 3 and node.inputs[3] is not None
    from ..codegen.attention_store import chain_after
    stored = chain_after(program, list(nodes), nid)
    views = [n for n in nodes if n != nid and n not in stored]
    sched = {"op": SDPA, "alias": False, "fused_attention": True, "L": q.shape[-2], "S": k.shape[-2],
             "head_dim": q.shape[-1], "causal": bool(node.attrs.get("is_causal")), "mask": mask,
             "views_read_in_place": views, "views_stored_through": stored}
    what = "q, k, v and the mask" if mask else "q, k and v"
    how = ""
    if views:
        ops = list(dict.fromkeys(program.nodes[n].op for n in views))
        srcs = sorted({program.values[v].name for v in facts.reads} if facts is not None else ())
        how = (f" in place through {len(views)} view{'s' if len(views) > 1 else ''} ({', '.join(ops)}"
               f"{' of ' + ', '.join(srcs) if srcs else ''}, no copy kernel)")
    where = ""
    if stored:
        ops = list(dict.fromkeys(program.nodes[n].op for n in stored))
        where = f" in the layout its reader takes, through {len(stored)} view{'s' if len(stored) > 1 else ''} " \
                f"after it ({', '.join(ops)}, no copy kernel)"
    reason = (f"{node.name} runs as our fused attention kernel (FlashAttention-2 schedule, "
              f"{score_words(node.attrs.get('score') or 'softmax')}): "
              f"reads {what} once{how} and writes the output once{where} ({fmt_bytes(nbytes)} moved), the "
              f"{q.shape[-2]}x{k.shape[-2]} scores stay on chip; {flops / 1e9:.3g} GFLOP"
              f"{' (causal: half the tiles)' if sched['causal'] else ''}; about {fmt_ms(ms)} at the roofline.")
    return sched, reason, ms
