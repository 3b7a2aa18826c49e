"""The agent's side of our fused attention kernel (codegen/attention.py): whether a lone SDPA region is
generated instead of run through torch, the precision form a region falls back to when the tensor-core
form does not verify, and how the kept form is described (in agent/precision.py's wording)."""
from __future__ import annotations

from ..codegen import generate_kernel
from ..codegen.attention import SDPA, attention_supported

FORM_WORDS = {"fp32": "fp32 FFMA in our fused attention kernel",
              "3xtf32": "split TF32 in our fused attention kernel: three tensor-core products summed "
                        "(mma.sync m16n8k8, hi and lo parts)"}


def own_attention(program, node) -> bool:
    """A lone SDPA node our kernel takes (it is generated, verified and timed like any region)."""
    return node.op == SDPA and attention_supported(program, node.id) is None


def library_note(program, node) -> str:
    """Why a lone SDPA still runs through torch (appended to the library reason)."""
    if node.op != SDPA:
        return ""
    return f"; not our fused attention kernel: {attention_supported(program, node.id)}"


def form_of(ks) -> str | None:
    return (ks.params or {}).get("form") if ks.kind == "attention" else None


def describe_form(ks) -> str:
    form = form_of(ks)
    return f"attention form {form} ({FORM_WORDS[form]})" if form else ""


def exact_form(agent, r, ks, res):
    """After the default form failed verification: the fp32 form, built, loaded and verified.
    Returns (ks, loaded, runner, res) of the fp32 form, or None when ks is no tensor-core attention."""
    from ..compiler import compile_kernel
    from ..runtime.launch import load_kernel
    if form_of(ks) != "3xtf32":
        return None
    params = {**ks.params, "form": "fp32", "block_rows": None, "block_cols": None, "warps": None, "stages": None}
    k2 = generate_kernel(agent.program, r.nodes, name=ks.name, kind=r.kind, params=params)
    loaded = load_kernel(k2, agent.program, compile_kernel(k2, arch=agent.arch))
    runner = agent._runner(r, k2, loaded)
    agent.ev.emit("precision", node=k2.node_ids[-1], op=SDPA, chosen="fp32",
                  reason=f"region {r.id} failed verification with split TF32 ({res.reason}); trying fp32 FFMA")
    return k2, loaded, runner, agent._verify(r, runner, agent.draws, "attention in fp32")


def note_kept_form(agent, r, ks) -> str:
    """Emit which form the region keeps; the words for its decision log."""
    form = form_of(ks)
    if not form:
        return ""
    agent.ev.emit("precision", node=ks.node_ids[-1], op=SDPA, chosen=form,
                  reason=f"region {r.id} keeps {describe_form(ks)}: it verified at the program's tolerance")
    return f"; {describe_form(ks)}"
