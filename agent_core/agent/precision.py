"""Per matmul / convolution node: how its library call runs (runtime.split_tf32): plain fp32, split TF32
on tensor cores (three calls summed, or for a convolution one call over channel-concatenated parts),
or (convolutions) fp32 with a cuDNN algorithm picked by timing. Every form is timed on the node's
shapes and must agree with fp32 within the program's tolerance (verify.tolerance: 1e-4 unless the
program sets its own) on the timing draw. Lower precisions (TF32, fp16, bf16: runtime/low_precision.py)
are timed too where the program allows them. The more accurate form wins unless a less
accurate one is clearly faster. The end-to-end verification against the fp32 reference has the last
word.

A memory-bound convolution (depthwise, small-channel or 1x1 over few channels: fewer FLOPs per byte
moved than fp32 itself keeps up with) is offered the fp32 forms only: a split form reads its operands
three times (or a three-times-wider input) to save arithmetic that was never the limit.

A 2-D or 3-D convolution is timed in each of its forms in the layout its input comes in, then the
fastest of them once more in channels-last memory (runtime.split_tf32's "channels_last" layout). The
channels-last time counts converting the input from contiguous (none when it arrives channels-last from
an earlier channels-last convolution through torch-run ops) and, when a generated kernel or the
program's caller reads the output, converting it back. Nothing is taken to be faster: the layout is kept
only where it measures faster by MIN_GAIN, like any less accurate form. Only the fastest form is tried
in the other layout because every try is a cuDNN algorithm search (cudnn.benchmark) for a new shape and
setting, and timing all of them in both layouts was most of a convolutional net's agent time, while
channels-last won for none of level 2's convolutions (tools/conv_tf32_layout_probe.py) and for 5 of
16_DenseNet201's 57 timed ones."""
from __future__ import annotations

from ..analysis.gpu import H200, GPUProfile
from ..codegen import LIBRARY_CATEGORIES
from ..ir import Program
from ..reference import run_node
from ..runtime.low_precision import BF16, FP16, TF32, allowed, run_low_precision
from ..runtime.split_k import (SPLIT_K, can_split_k, fit_parts, forget_parts, most_parts, parts, parts_within,
                               run_split_k)
from ..runtime.split_tf32 import (CHANNELS_LAST, TF32X3, TF32X3_CAT, TIMED_FP32, can_channels_last, can_concatenate,
                                  can_split, library_layout, library_precision, run_in_layout, run_split_tf32,
                                  run_split_tf32_cat, run_timed_fp32, to_channels_last)
from ..text import first_line
from ..verify import tolerance

MIN_GAIN = 1.05   # below this the choice would follow timing noise
# the forms, most accurate first, and their event fields
ERRORS_KEY = "library_precision_errors"   # program.metadata: node id -> why only fp32 was tried there
FIELDS = {"fp32": "fp32_ms", TIMED_FP32: "timed_fp32_ms", SPLIT_K: "fp32_splitk_ms", TF32X3: "tf32x3_ms",
          TF32X3_CAT: "tf32x3_cat_ms", TF32: "tf32_ms", FP16: "fp16_ms", BF16: "bf16_ms"}
CL = "+" + CHANNELS_LAST     # a form's channels-last variant: "fp32+channels_last", "3xtf32-cat+channels_last"
# every variant, most accurate first; a form's channels-last variant right after it (the same products)
ORDER = [k for m in FIELDS for k in (m, m + CL)]
LAYOUT_PRESERVING = frozenset({"relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "hardtanh", "hardswish",
                               "elu", "mish", "softplus", "clamp", "add", "sub", "mul", "div", "neg", "abs",
                               "add_scalar", "sub_scalar", "mul_scalar", "div_scalar",
                               "batch_norm", "max_pool2d", "max_pool3d", "avg_pool2d", "avg_pool3d", "dropout"})


def split_variant(key: str) -> tuple[str, str | None]:
    """("3xtf32-cat", "channels_last") for "3xtf32-cat+channels_last"; (form, None) for a plain form."""
    return (key[:-len(CL)], CHANNELS_LAST) if key.endswith(CL) else (key, None)


def field(key: str) -> str:
    form, layout = split_variant(key)
    return FIELDS[form] if layout is None else FIELDS[form][:-3] + "_cl_ms"


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
    if can_split_k(program, nid):      # few output tiles, a long reduction (runtime/split_k.py)
        forms[SPLIT_K] = run_split_k
    if memory_bound(program, nid):
        return forms
    forms[TF32X3] = run_split_tf32
    if can_concatenate(program, nid):
        forms[TF32X3_CAT] = run_split_tf32_cat
    for form in allowed(program):      # only where the user allows them (runtime/low_precision.py)
        forms[form] = lambda p, n, env, form=form: run_low_precision(p, n, env, form)
    return forms


def _region_nodes(program: Program) -> set[str]:
    """Nodes a generated kernel computes (library nodes of a library+kernel region excluded)."""
    from ..codegen import LIBRARY_CATEGORIES as LIB
    return {n for r in program.regions if r.status != "rejected" and len(r.nodes) > 1
            for n in r.nodes if n in program.nodes and program.nodes[n].opdef.category not in LIB}


def arrives_channels_last(program: Program, nid: str, layouts: dict[str, str], kernels: set[str]) -> bool:
    """The conv's input comes channels-last: from a channels-last conv through torch-run ops that keep
    the layout (a generated kernel writes contiguous memory)."""
    vid = program.nodes[nid].inputs[0]
    while True:
        prod = program.values[vid].producer
        if prod is None or prod in kernels:
            return False
        node = program.nodes[prod]
        if layouts.get(prod) == CHANNELS_LAST:
            return True
        if node.op not in LAYOUT_PRESERVING or not node.inputs or node.inputs[0] is None or (
                "pool" not in node.op and list(program.values[node.inputs[0]].shape) != list(program.values[vid].shape)):
            return False
        vid = node.inputs[0]


def leaves_contiguous(program: Program, nid: str, kernels: set[str]) -> bool:
    """Whether the conv's output must be made contiguous again: a generated kernel reads it (through
    torch-run ops that keep the layout) or the program returns it."""
    readers = program.consumer_map()
    todo, seen = [program.nodes[nid].outputs[0]], set()
    while todo:
        vid = todo.pop()
        if vid in seen:
            continue
        seen.add(vid)
        if vid in program.outputs:
            return True
        for c, _ in readers.get(vid, ()):
            if c in kernels:
                return True
            node = program.nodes[c]
            if node.op in LAYOUT_PRESERVING:
                todo.extend(o for o in node.outputs if o)
    return False


def variants(program: Program, nid: str, layouts: dict[str, str] | None = None,
             kernels: set[str] | None = None) -> dict:
    """Every form of the node and, for a 2-D / 3-D convolution, each one's channels-last variant, as
    key -> run(program, nid, env). A channels-last run converts the input the way the program will
    (from contiguous unless it arrives channels-last) and the output back where it must."""
    forms = _forms(program, nid)
    out = dict(forms)
    if not can_channels_last(program, nid):
        return out
    layouts = library_layout(program) if layouts is None else layouts
    kernels = _region_nodes(program) if kernels is None else kernels
    src = program.nodes[nid].inputs[0]
    dst = program.nodes[nid].outputs[0]
    arrives = arrives_channels_last(program, nid, layouts, kernels)
    back = leaves_contiguous(program, nid, kernels)

    ready: dict[int, tuple] = {}    # input tensor id -> (it, its channels-last copy), made once, untimed

    def cl(run):
        def go(p, n, env):
            if arrives:   # as it will come: already channels-last (the conversion happened upstream)
                t = env[src]
                if id(t) not in ready:
                    ready[id(t)] = (t, to_channels_last(t))
                env[src] = ready[id(t)][1]
            if run in (run_split_tf32, run_split_tf32_cat):   # make their parts channels-last themselves
                run(p, n, env, True, True)      # (.., cache_weights, channels_last)
            else:
                run_in_layout(p, n, env, run, CHANNELS_LAST)
            if back:
                env[dst] = env[dst].contiguous()
        return go
    for mode, run in forms.items():
        out[mode + CL] = cl(run)
    return out


SPLIT_VARIANTS = (TF32X3, TF32X3_CAT, TF32X3 + CL, TF32X3_CAT + CL)


def over_room(program: Program, nid: str, forms, room: int | None) -> list[str]:
    """The split variants among `forms` (keys) whose parts need more than `room` bytes at this call
    (None: no limit)."""
    from ..program_runtime.memory_plan import split_parts_bytes
    if room is None:
        return []
    out = []
    for key in forms:
        form, layout = split_variant(key)
        if form in (TF32X3, TF32X3_CAT) and split_parts_bytes(program, nid, form, layout is not None) > room:
            out.append(key)
        if form == SPLIT_K and parts_within(program, nid, room) < 2:
            out.append(key)
    return out


def pick(ms: dict[str, float], disagree) -> str:
    """The fastest form that agrees with fp32, unless a more accurate one is within MIN_GAIN of it."""
    fits = [m for m in ORDER if m in ms and m not in disagree]
    fastest = min(fits, key=ms.get)
    return next(m for m in fits if ms[m] <= ms[fastest] * MIN_GAIN)


def temporaries(program: Program, nid: str, run, env: dict) -> int:
    """Peak GPU bytes one call of the node in form `run` allocates beyond its output: its temporaries
    (split parts, a layout copy) and the library's workspace, which the algorithm cuDNN picks by timing
    can make far larger than the one its heuristics pick (5_AlexNet: 1.2 GB more at one call at
    3883459). 0 off the GPU."""
    import torch
    if not torch.cuda.is_available():
        return 0
    from ..profile.peak_memory import peak_above
    result = dict(env)

    def call():
        run(program, nid, result)
        return result
    peak = peak_above(call)
    return max(0, peak - result[program.nodes[nid].outputs[0]].untyped_storage().nbytes())


def workspace_bytes(program: Program) -> dict[str, int]:
    """Per node, what its chosen form allocates while it runs beyond the memory plan's model of it and
    beyond plain fp32's own (measured by choose_library_precision)."""
    return program.metadata.get("library_workspace_bytes") or {}


def choose_library_precision(program: Program, tensors_for, emit, trials: int, nodes=None,
                             room: dict[str, int] | None = None) -> dict[str, str]:
    """Time every eligible node each way (or those in `nodes`); tensors_for(value ids) -> GPU tensors
    (parameters real). Writes and returns program.metadata["library_precision"] (node id -> its form,
    fp32 ones left out). room: per node, the bytes a form may add there within the memory budget
    (memory_plan.split_room): the split forms whose modeled parts need more are not timed (they could
    not run), and a form whose measured temporaries and workspace need more, and more than plain
    fp32's, is not chosen. What the chosen form adds beyond the plan's model goes to library_workspace_bytes."""
    import torch

    from ..profile.timing import gpu_work
    from ..program_runtime.memory_plan import call_temp_bytes, layout_weight_bytes
    from .quick_timing import time_candidate
    chosen: dict[str, str] = {}
    layouts: dict[str, str] = {}
    gains: dict[str, float] = {}       # ms a split form saves against fp32 in its layout (memory_plan weighs it)
    workspace: dict[str, int] = {}
    if nodes is None:
        program.metadata.pop(ERRORS_KEY, None)
        program.metadata.pop("library_layout", None)
        program.metadata.pop("library_precision_gain_ms", None)
        program.metadata.pop("library_workspace_bytes", None)
    kernels = _region_nodes(program)
    atol, rtol = tolerance(program)
    timed = library_nodes(program) if nodes is None else list(nodes)
    for nid in timed:
        node = program.nodes[nid]
        env = {v: t for v, t in zip(node.inputs, tensors_for([v for v in node.inputs if v])) if v}
        out = node.outputs[0]
        ms, disagree, extra, need, heavy = {}, [], {}, {}, []
        forms = variants(program, nid, {**library_layout(program), **layouts}, kernels)
        here = (room or {}).get(nid)
        too_big = over_room(program, nid, forms, here)
        if SPLIT_K in forms:
            fit_parts(program, nid, here)
        fp32 = None   # fp32's result; each other form's is compared with it and dropped

        def measure(mode):
            nonlocal fp32
            run = forms[mode]
            with gpu_work():               # the untimed calls never run during another problem's measurement
                result = dict(env)
                run(program, nid, result)  # the first call: cuDNN's algorithm search, a weight's parts cached
                if fp32 is None:
                    fp32 = result[out]
                elif not torch.allclose(result[out], fp32, rtol=rtol, atol=atol):
                    disagree.append(mode)
                del result
                against = min((t for m, t in ms.items() if m not in disagree + heavy), default=None)
                ms[mode] = time_candidate(lambda: run(program, nid, dict(env)), trials=trials,
                                          best_ms=against)[0].median_ms   # clearly slower: stopped early
                extra[mode] = temporaries(program, nid, run, env)
            # the room is the budget less what the plan has live at this call, which models no
            # workspace: a form's whole measured extra must fit in it, with a plain form's
            # channels-last weight (cached while measured, but there at the call as a cache or a
            # per-call copy; the plan can uncache it, not undo the layout). Only the excess over
            # fp32's was compared when 9_ResNet18's channels-last layer-4 convolutions (9 MiB weights,
            # 10 MiB left there) ran it at 1.77x eager's peak. Plain fp32's own is what eager needs.
            need[mode] = extra[mode] + (layout_weight_bytes(program, nid)
                                        if mode.endswith(CL) and mode not in SPLIT_VARIANTS else 0)
            if here is not None and need[mode] > max(here, extra.get("fp32", 0)):
                heavy.append(mode)
        try:
            with torch.no_grad():
                for mode in (m for m in forms if m not in too_big and not m.endswith(CL)):
                    measure(mode)
                other = pick(ms, disagree + heavy) + CL   # the fastest form's channels-last variant, if any
                if other in forms and other not in too_big:
                    measure(other)
            fp32 = None
        except Exception as exc:  # noqa: BLE001 - a node that cannot be timed stays fp32
            emit.log(f"{node.name} ({node.op}): only fp32 tried: {type(exc).__name__}: {exc}",
                     level="warning", node=nid)
            # kept for the bench record: out of memory here is most often other processes' doing
            program.metadata.setdefault(ERRORS_KEY, {})[nid] = f"{type(exc).__name__}: {first_line(exc)[:200]}"
            continue
        best = pick(ms, disagree + heavy)
        why = (f"{ms['fp32'] / ms[best]:.2f}x faster than plain fp32 ({ms[best]:.3f} ms vs {ms['fp32']:.3f} ms)"
               if best != "fp32" else "no other form is faster")
        form, layout = split_variant(best)
        if can_channels_last(program, nid):
            other = form if layout else form + CL
            if other in ms and other not in disagree + heavy:
                why += (f"; channels-last {'kept' if layout else 'not kept'}: {ms[form + CL]:.3f} ms against "
                        f"{ms[form]:.3f} ms in the input's layout (conversions counted)")
        if form == SPLIT_K:
            s, most = parts(program, nid), most_parts(program, nid)
            why += (f"; its reduction cut into {s} parts" + (f", the most whose partial products fit in the "
                    f"memory budget here (the SMs take {most})" if s < most else ""))
        else:
            forget_parts(program, nid)
        if disagree:
            why += (f"; {', '.join(disagree)} disagreed with fp32 beyond the tolerance (atol {atol:g}, "
                    f"rtol {rtol:g}) on a random draw")
        if memory_bound(program, nid):
            why += (f"; memory-bound ({intensity(program, nid):.1f} FLOP/B, below fp32's ridge), "
                    f"so the split-TF32 forms were not tried")
        if too_big:
            why += (f"; not timed, their parts being more than the memory budget leaves at this call "
                    f"({max(0, here) / 2**20:.1f} MiB): " + ", ".join(too_big))
        if heavy:
            why += (f"; not chosen, their temporaries and workspace needing more than the memory budget "
                    f"leaves at this call ({max(0, here) / 2**20:.1f} MiB) and more than plain fp32's "
                    f"({extra.get('fp32', 0) / 2**20:.1f} MiB): "
                    + ", ".join(f"{m} ({need[m] / 2**20:.1f} MiB)" for m in heavy))
        emit.emit("precision", node=nid, op=node.op, chosen=form, reason=why,
                  **({"layout": layout or "as input"} if can_channels_last(program, nid) else {}),
                  **{field(m): t for m, t in ms.items()})
        if form != "fp32":
            chosen[nid] = form
            plain = ms.get("fp32" + (CL if layout else ""), ms["fp32"])
            gains[nid] = round(plain - ms[best], 6)
        beyond = extra.get(best, 0) - extra.get("fp32", 0) - call_temp_bytes(program, nid, form, layout is not None)
        if beyond > 0:
            workspace[nid] = beyond
        if layout:
            layouts[nid] = layout
    program.metadata["library_precision"] = chosen
    program.metadata["library_precision_gain_ms"] = {**(program.metadata.get("library_precision_gain_ms") or {}),
                                                     **gains}
    program.metadata["library_layout"] = layouts
    kept = {n: b for n, b in workspace_bytes(program).items() if n not in timed}   # an earlier pass's
    program.metadata["library_workspace_bytes"] = {**kept, **workspace}
    return chosen


def library_forms(program: Program) -> dict[str, dict]:
    """Every matmul and convolution the chooser considers, with the form it runs in (fp32 included)
    and why it was offered what it was: the bench record's view of the library calls."""
    chosen = library_precision(program)
    layouts = library_layout(program)
    out = {}
    for nid in library_nodes(program):
        node = program.nodes[nid]
        entry = {"name": node.name, "op": node.op, "form": chosen.get(nid, "fp32"),
                 "layout": layouts.get(nid, "as input"),
                 "flop_per_byte": round(intensity(program, nid), 2), "memory_bound": memory_bound(program, nid)}
        if node.opdef.category == "convolution":
            entry["groups"] = node.attrs.get("groups", 1)
        out[nid] = entry
    return out


def fit_to_memory(program: Program, steps, emit) -> list[str]:
    """Before the regions are tuned: the split-TF32 forms whose parts the memory budget cannot hold
    (program_runtime.memory_plan, on `steps`: steps.planned_steps, as if every planned region were
    kept) run in fp32 instead, each with a precision event. So the tuner times a library+kernel region against the
    library call as the program will run it, and the tile GEMM (split in registers, no parts in
    memory) wins where cuBLAS's split would not fit. The built program's own plan has the last word.
    A call set back runs in its input's layout too: channels-last was kept for the split form it
    measured faster in, while plain fp32 there was neither timed nor measured, and its per-call weight
    copy and workspace are not what eager's call allocates (9_ResNet18's layer-4 convolutions, set back
    from 3xtf32, ran fp32 channels-last at 18.5 MiB a call where eager's whole peak is 12.3).
    Returns the nodes set back to fp32."""
    from ..program_runtime.memory_plan import plan_memory
    chosen = library_precision(program)
    if not chosen:
        return []
    plan = plan_memory(program, steps)
    back = [n for n, d in plan.decisions.items() if d.runs_as == "fp32"]
    layouts = library_layout(program)
    for nid in back:
        chosen.pop(nid, None)
        was = layouts.pop(nid, None)
        emit.emit("precision", node=nid, op=program.nodes[nid].op, chosen="fp32",
                  **({"layout": "as input"} if can_channels_last(program, nid) else {}),
                  reason=f"{plan.decisions[nid].reason} (before tuning, with the planned regions)"
                         + ("; in its input's layout, as eager runs it: channels-last was kept for the "
                            "split form" if was else ""))
    return back
