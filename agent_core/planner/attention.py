"""How the planner labels and costs a group that is one scaled_dot_product_attention node (with only
views beside it) which our fused attention kernel takes (codegen/attention.py): one kernel that reads
q, k, v and the mask once and writes the output once, 4 B H L S D flops (half when causal)."""
from __future__ import annotations

import math

from ..analysis.cost import fmt_bytes, fmt_ms

SDPA = "scaled_dot_product_attention"


def attention_node(state, nodes) -> str | None:
    """The SDPA node of a group our attention kernel runs: the group's only non-view node, accepted by
    attention_supported; else None."""
    from ..codegen.attention import attention_supported
    real = [n for n in nodes if not state.costs[n].view]
    if len(real) != 1 or state.program.nodes[real[0]].op != SDPA:
        return None
    return real[0] if attention_supported(state.program, real[0]) is None else None


def attention_estimate(state, nid: str) -> tuple[float, int, int]:
    """(roofline ms, bytes, flops) of the fused kernel for SDPA node nid."""
    program, gpu = state.program, state.gpu
    node = program.nodes[nid]
    vals = program.values
    q, k, v = (vals[x] for x in node.inputs[:3])
    nbytes = sum(vals[x].nbytes for x in node.inputs if x) + vals[node.outputs[0]].nbytes
    out = vals[node.outputs[0]]
    batch = math.prod(out.shape[:-2])
    flops = 2 * batch * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if node.attrs.get("is_causal"):
        flops //= 2
    return gpu.launch_ms(state.graph) + max(nbytes / gpu.bytes_per_ms, flops / gpu.flops_per_ms), nbytes, flops


def attention_reason(state, nid: str) -> tuple[dict, str, float]:
    """(schedule, reason, estimated ms) of the region."""
    ms, nbytes, flops = attention_estimate(state, nid)
    node = state.program.nodes[nid]
    q = state.program.values[node.inputs[0]]
    k = state.program.values[node.inputs[1]]
    mask = len(node.inputs) > 3 and node.inputs[3] is not None
    sched = {"op": SDPA, "alias": False, "fused_attention": True, "L": q.shape[-2], "S": k.shape[-2],
             "head_dim": q.shape[-1], "causal": bool(node.attrs.get("is_causal")), "mask": mask}
    what = "q, k, v and the mask" if mask else "q, k and v"
    reason = (f"{node.name} runs as our fused attention kernel (FlashAttention-2 schedule, online softmax): "
              f"reads {what} once and writes the output once ({fmt_bytes(nbytes)}), the "
              f"{q.shape[-2]}x{k.shape[-2]} scores stay on chip; {flops / 1e9:.3g} GFLOP"
              f"{' (causal: half the tiles)' if sched['causal'] else ''}; about {fmt_ms(ms)} at the roofline.")
    return sched, reason, ms
