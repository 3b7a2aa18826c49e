"""The agent's side of the tile GEMM (codegen/gemm_mma.py): a region that runs as a library call plus
an epilogue kernel ("library+kernel": cuBLAS in the form agent/precision.py chose, then our kernel)
gets the matmul and its epilogue as ONE generated kernel as another form: generate_kernel lists it in
the epilogue kernel's `alternatives`, and the tuner tries those first (agent/tune.py), as it tries
attention's other precision form: generated, quickly verified and timed against the library form's
measured time on the same inputs, the faster one kept. The kept one is verified again on every draw,
and a tile GEMM that fails that check gives way to the library form it was measured against
(loop.py). The region's reason says which form runs and why.

When the tile GEMM is kept, its matmul no longer runs through the library, so its split-TF32 choice
(and the hi / lo caches that choice keeps beside the weight) is dropped: the fused kernel splits in
registers and needs neither (issue 17's peak memory).

A convolution (groups 1) runs through the same kernel as an implicit GEMM (codegen/gemm_conv.py), as
the other form of a cuDNN + epilogue region. A matmul or convolution alone that is compute-bound (or a
few-channel convolution) gets the tile GEMM as the only generated form of its region, timed against the
library call and kept only where it is faster (gemm_mma.lone_gemm).

A convolution whose reduction per output element is short (input channels per group x taps at most
conv.DIRECT_MAX_REDUCTION) gets the direct convolution (codegen/conv.py, fp32 FFMA, the export's kernel)
as one more such form, kept the same way: few channels leave cuDNN's tiling and the tensor cores little to
gain over one thread per output position.
"""
from __future__ import annotations

from ..codegen import gemm_tma
from ..codegen.conv import CONV_OPS, DIRECT, thread_outputs
from ..codegen.gemm_mma import FORM, GEMM_OPS, gemm_spec
from ..codegen.kernel import CodegenError
from ..codegen.region_io import region_io

OWN_FORMS = (FORM, DIRECT)     # kernels that run the region's matmul / convolution themselves
NAMES = {FORM: "the tile GEMM with the epilogue fused", DIRECT: "the direct convolution with the epilogue fused"}


def words(ks) -> str:
    """What the kernel ks of an own form runs as, for a reason: the tile GEMM's tensor-core instruction
    by its params, the direct convolution's schedule."""
    p = ks.params or {}
    if p.get("form") == DIRECT:
        ppt = int(p.get("positions_per_thread") or 1)
        per = thread_outputs(ppt, int(p.get("outputs_per_thread") or ppt) // ppt)
        fused = " with the epilogue fused" if len(ks.node_ids) > 1 else ""
        staged = ", its weights staged in shared memory" if p.get("stage_weights") else ""
        return (f"our direct convolution{fused} (fp32 FFMA, one thread per {per} "
                f"and {p.get('channels_per_thread')} output channel(s){staged})")
    if p.get("tf32"):
        return "our tile GEMM with the epilogue fused: TF32 on the tensor cores, as the program allows (mma.sync m16n8k8)"
    how = (f"wgmma m64n{p.get('block_n')}k8, warp-specialised: TMA copies, A split in registers, B in shared memory"
           if p.get("mma") == gemm_tma.MMA else "mma.sync m16n8k8, split in registers")
    return f"our tile GEMM with the epilogue fused: split TF32 on the tensor cores ({how})"


def is_gemm(ks) -> bool:
    return ks is not None and (ks.params or {}).get("form") == FORM


def runs_own(ks) -> bool:
    """Whether ks runs its region's matmul / convolution itself instead of through the library."""
    return ks is not None and (ks.params or {}).get("form") in OWN_FORMS


def _form(t: dict) -> str | None:
    return (t.get("params") or {}).get("form")


def why_not(program, node_ids) -> str | None:
    """Why a library+kernel region cannot run as the tile GEMM (None when it can)."""
    try:
        gemm_spec(program, region_io(program, node_ids))
    except CodegenError as exc:
        return str(exc)
    return None


def compiled_words(program, ks) -> str:
    """Without a GPU: that the tuning variants that compiled hold the tile GEMM form."""
    if runs_own(ks) and not is_gemm(ks):     # a transposed convolution alone: the direct forms
        return ", all of them the direct convolution, to be timed against cuDNN on a GPU (the faster is kept)"
    if is_gemm(ks) and not ks.library_nodes:     # a matmul or convolution alone: the tile form is its kernel
        if not any(program.nodes[n].op in CONV_OPS for n in ks.node_ids):
            return ", all of them the tile GEMM, to be timed against cuBLAS on a GPU (the faster is kept)"
        if any(a.get("form") == DIRECT for a in ks.alternatives):
            return (", the implicit-GEMM convolution and the direct one (fp32 FFMA) among them, to be timed "
                    "against cuDNN on a GPU (the fastest is kept)")
        return ", all of them the implicit-GEMM convolution, to be timed against cuDNN on a GPU (the faster is kept)"
    if not any(a.get("form") == FORM for a in ks.alternatives):
        return ""
    return (", the tile GEMM form among them (the matmul and its epilogue as one kernel, split TF32 in "
            "registers), to be timed against the library form + epilogue kernel on a GPU")


def trial_words(trials: list[dict], against: str = "the library form's", skip: str | None = None) -> str:
    """What the tuner's trials say of each own form (the tile GEMM, the direct convolution) that was not
    kept: slower than the kept one (its time `against`), or why it did not run; none of form `skip`."""
    lib = _library_trial(trials)
    refused = {_form(t) for t in trials if t.get("trial") == "full"}    # failed the full verification
    kept_ms = min((t["ms"] for t in trials if t.get("best") and t.get("ok") and _form(t) not in refused),
                  default=lib["ms"] if lib else None)
    out = ""
    for form in OWN_FORMS:
        tried = [t for t in trials if _form(t) == form]
        if not tried or form == skip:
            continue
        ok = [t for t in tried if t.get("ok")]
        if ok and kept_ms is not None and form not in refused:
            out += (f"; {NAMES[form]} was slower ({min(t['ms'] for t in ok) * 1e3:.1f} us vs {against} "
                    f"{kept_ms * 1e3:.1f} us)")
        else:
            reasons = "; ".join(dict.fromkeys(str(t.get("reason")) for t in tried if not t.get("ok")))
            out += f"; {NAMES[form]} was not kept: {reasons}"
    return out


def kept_words(ks, trials: list[dict]) -> str:
    """The kept own form, against the library form it was timed with, and how the other own form did."""
    lib = _library_trial(trials)
    form = (ks.params or {}).get("form")
    mine = min((t["ms"] for t in trials if t.get("ok") and _form(t) == form), default=None)
    vs = (f", {lib['ms'] / mine:.2f}x the library form + epilogue kernel ({mine * 1e3:.1f} us vs "
          f"{lib['ms'] * 1e3:.1f} us)") if lib and mine else ""
    return f"; runs as {words(ks)}{vs}" + trial_words(trials, "the kept form's", skip=form)


def _library_trial(trials: list[dict]) -> dict | None:
    """The default's trial when it ran the library form + epilogue kernel (a matmul or convolution alone
    starts with the tile form: it has none)."""
    return next((t for t in trials if t.get("trial") == 0 and t.get("ok")
                 and _form(t) not in OWN_FORMS), None)


def lone_words(program, ks, kept: bool, ms: float, unfused: float) -> str:
    """What a matmul or convolution alone runs as: our kernel where it beat the library call, else the
    library call and why."""
    from ..runtime.split_tf32 import describe_library_call
    node = next(program.nodes[n] for n in ks.node_ids if program.nodes[n].op in GEMM_OPS + CONV_OPS)  # not a view
    conv = node.op in CONV_OPS
    lib = f"{'cuDNN' if conv else 'cuBLAS'}'s {describe_library_call(program, node.id)}"
    name = ("direct convolution" if (ks.params or {}).get("form") == DIRECT else "implicit GEMM") if conv else \
        "tile GEMM"
    how = words(ks) if name == "direct convolution" else f"our {name} ({words(ks)})"
    if kept:
        return f"; {node.name} ({node.op}) runs as {how} instead of {lib}"
    return (f"{node.name} ({node.op}) runs through {lib} via torch: {how} was correct "
            f"but slower ({ms * 1e3:.1f} us vs {unfused * 1e3:.1f} us)")


def keep(agent, r, ks) -> None:
    """The region keeps an own form (the tile GEMM, the direct convolution): its matmul's or
    convolution's library precision and layout choices (and the split caches they would keep) no longer
    apply; an event says so."""
    from ..runtime.split_tf32 import drop_cached_splits, library_layout, library_precision
    chosen = library_precision(agent.program)
    node = next(agent.program.nodes[n] for n in ks.node_ids if agent.program.nodes[n].op in GEMM_OPS + CONV_OPS)
    was = chosen.pop(node.id, None) if chosen else None
    library_layout(agent.program).pop(node.id, None)   # a convolution's channels-last call is gone too
    params = getattr(agent, "_params", None) or {}
    freed = drop_cached_splits([params[v] for v in node.inputs[:2] if v in params])
    agent.ev.emit("precision", node=node.id, op=node.op, chosen=ks.params["form"],
                  reason=f"region {r.id} keeps {words(ks)}" + (f" instead of the library's {was}" if was else "")
                         + (f"; {freed / 2**20:.0f} MiB of split-weight caches dropped" if freed else ""))
