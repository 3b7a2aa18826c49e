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

A convolution (groups 1) runs through the same kernel as an implicit GEMM (codegen/gemm_conv.py): as
the other form of a cuDNN + epilogue region, and, where it is compute-bound, as the only generated
form of a convolution alone, timed against the cuDNN call and kept only where it is faster.
"""
from __future__ import annotations

from ..codegen import gemm_wgmma
from ..codegen.gemm_mma import FORM, gemm_spec
from ..codegen.kernel import CodegenError
from ..codegen.region_io import region_io

def words(ks) -> str:
    """What the tile GEMM kernel ks runs as, for a reason: its tensor-core instruction by its params."""
    p = ks.params or {}
    how = (f"wgmma m64n{p.get('block_n')}k8, A split in registers, B in swizzled shared memory"
           if p.get("mma") == gemm_wgmma.MMA else "mma.sync m16n8k8, split in registers")
    return f"our tile GEMM with the epilogue fused: split TF32 on the tensor cores ({how})"


def is_gemm(ks) -> bool:
    return ks is not None and (ks.params or {}).get("form") == FORM


def why_not(program, node_ids) -> str | None:
    """Why a library+kernel region cannot run as the tile GEMM (None when it can)."""
    try:
        gemm_spec(program, region_io(program, node_ids))
    except CodegenError as exc:
        return str(exc)
    return None


def compiled_words(ks) -> str:
    """Without a GPU: that the tuning variants that compiled hold the tile GEMM form."""
    if is_gemm(ks) and not ks.library_nodes:
        return ", all of them the implicit-GEMM convolution, to be timed against cuDNN on a GPU (the faster is kept)"
    if not any(a.get("form") == FORM for a in ks.alternatives):
        return ""
    return (", the tile GEMM form among them (the matmul and its epilogue as one kernel, split TF32 in "
            "registers), to be timed against the library form + epilogue kernel on a GPU")


def trial_words(trials: list[dict]) -> str:
    """What the tuner's trials say of the tile GEMM, for a region that kept the library form."""
    tried = [t for t in trials if (t.get("params") or {}).get("form") == FORM]
    if not tried:
        return ""
    lib = _library_trial(trials)
    ok = [t for t in tried if t.get("ok")]
    if ok and lib:
        best = min(ok, key=lambda t: t["ms"])
        return (f"; the tile GEMM with the epilogue fused was slower ({best['ms'] * 1e3:.1f} us vs the library "
                f"form's {lib['ms'] * 1e3:.1f} us)")
    reasons = "; ".join(dict.fromkeys(str(t.get("reason")) for t in tried if not t.get("ok")))
    return f"; the tile GEMM with the epilogue fused was not kept: {reasons}"


def kept_words(ks, trials: list[dict]) -> str:
    """The kept tile GEMM, against the library form it was timed with."""
    lib = _library_trial(trials)
    mine = min((t["ms"] for t in trials if t.get("ok") and (t.get("params") or {}).get("form") == FORM),
               default=None)
    vs = (f", {lib['ms'] / mine:.2f}x the library form + epilogue kernel ({mine * 1e3:.1f} us vs "
          f"{lib['ms'] * 1e3:.1f} us)") if lib and mine else ""
    return f"; runs as {words(ks)}{vs}"


def _library_trial(trials: list[dict]) -> dict | None:
    """The default's trial when it ran the library form + epilogue kernel (a convolution alone starts
    with the tile form: it has none)."""
    return next((t for t in trials if t.get("trial") == 0 and t.get("ok")
                 and (t.get("params") or {}).get("form") != FORM), None)


def lone_conv_words(program, ks, kept: bool, ms: float, unfused: float) -> str:
    """What a convolution alone runs as: our implicit GEMM where it beat cuDNN, else cuDNN and why."""
    from ..runtime.split_tf32 import describe_library_call
    node = program.nodes[ks.node_ids[0]]
    lib = f"cuDNN's {describe_library_call(program, node.id)}"
    if kept:
        return f"; {node.name} ({node.op}) runs as our implicit GEMM ({words(ks)}) instead of {lib}"
    return (f"{node.name} ({node.op}) runs through {lib} via torch: our implicit-GEMM kernel ({words(ks)}) was correct "
            f"but slower ({ms * 1e3:.1f} us vs {unfused * 1e3:.1f} us)")


def keep(agent, r, ks) -> None:
    """The region keeps the tile GEMM: its matmul's or convolution's library precision and layout
    choices (and the split caches they would keep) no longer apply; an event says so."""
    from ..runtime.split_tf32 import drop_cached_splits, library_layout, library_precision
    chosen = library_precision(agent.program)
    spec = gemm_spec(agent.program, region_io(agent.program, ks.node_ids))
    was = chosen.pop(spec.node, None) if chosen else None
    library_layout(agent.program).pop(spec.node, None)   # a convolution's channels-last call is gone too
    params = getattr(agent, "_params", None) or {}
    freed = drop_cached_splits([params[v] for v in (spec.b.value, spec.a.value) if v in params])
    agent.ev.emit("precision", node=spec.node, op=agent.program.nodes[spec.node].op, chosen=FORM,
                  reason=f"region {r.id} keeps {words(ks)}" + (f" instead of the library's {was}" if was else "")
                         + (f"; {freed / 2**20:.0f} MiB of split-weight caches dropped" if freed else ""))
