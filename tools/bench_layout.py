"""Layout kernels against torch on one GPU: pixel_shuffle (r = 2, 3, 4) + a broadcast mean, a
ShuffleNet channel shuffle (cat, view, transpose, view), a channels-last permute and YOLOv5's
detection decode. For each, our kernel is generated per variant (the default and the tile sizes
the tuner tries, agent_core.agent.tune.tune_space), verified against torch on 3 draws (atol = rtol =
1e-4) and timed against torch eager and torch.compile, all with the L2 flushed.

    python3 tools/bench_layout.py --quick        # under 3 minutes on an H200
    python3 tools/bench_layout.py --json layout.jsonl

One table: case, variant, our us, eager us, torch.compile us, floor us (the region's bytes read once
+ written / the measured copy bandwidth), % of floor, schedule. A failing variant prints its error
in its row and the run goes on. Needs torch and cupy only (no PySide6).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.kernel_survey import main as survey_main, survey_region  # noqa: E402

RGB_MEAN = (0.4488, 0.4371, 0.4040)


def _node(p, op, ins, attrs=None):
    return p.add_node(op, [v if isinstance(v, str) else v.id for v in ins], attrs or {})


def pixel_shuffle(shape, r):
    """F.pixel_shuffle(x, r) + mean[1, C, 1, 1], as the importer writes it (reshape, permute, reshape)."""
    import numpy as np
    import torch
    from agent_core.ir import Program
    n, c, h, w = shape
    co = c // (r * r)
    p = Program(f"pixel_shuffle_{r}")
    x = p.add_input("x", shape)
    mean = np.resize(np.array(RGB_MEAN, dtype=np.float32), co).reshape(1, co, 1, 1)
    m = p.add_parameter("rgb_mean", data=mean)
    a = _node(p, "reshape", [x], {"shape": [n, co, r, r, h, w]})
    b = _node(p, "permute", [a.outputs[0]], {"dims": [0, 1, 4, 2, 5, 3]})
    c2 = _node(p, "reshape", [b.outputs[0]], {"shape": [n, co, h * r, w * r]})
    d = _node(p, "add", [c2.outputs[0], m])
    p.mark_output(d.outputs[0])
    mt = torch.from_numpy(mean)
    return p, [a.id, b.id, c2.id, d.id], lambda t: torch.nn.functional.pixel_shuffle(t, r) + mt.to(t.device)


def channel_shuffle(shape, groups, cat=True, channels_last=False):
    """ShuffleNetV2: cat(a, b) along channels, then view(n, g, c/g, ...), transpose(1, 2), view back.
    channels_last: the data is [n, h, w, c] and the shuffle runs over the last dim."""
    import torch
    from agent_core.ir import Program
    p = Program("channel_shuffle")
    n, c = shape[0], (shape[-1] if channels_last else shape[1])
    half = list(shape)
    cdim = len(shape) - 1 if channels_last else 1
    half[cdim] = c // 2
    ids = []
    if cat:
        xa, xb = p.add_input("a", half), p.add_input("b", half)
        k = _node(p, "cat", [xa, xb], {"dim": cdim})
        ids.append(k.id)
        cur = k.outputs[0]
    else:
        cur = p.add_input("x", shape).id
    split = list(shape[:cdim]) + [groups, c // groups] + list(shape[cdim + 1:])
    a = _node(p, "reshape", [cur], {"shape": split})
    t = _node(p, "transpose", [a.outputs[0]], {"dim0": cdim, "dim1": cdim + 1})
    b = _node(p, "reshape", [t.outputs[0]], {"shape": list(shape)})
    ids += [a.id, t.id, b.id]
    p.mark_output(b.outputs[0])

    def fn(*ts):
        x = torch.cat(ts, dim=cdim) if cat else ts[0]
        return x.view(split).transpose(cdim, cdim + 1).contiguous().view(list(shape))
    return p, ids, fn


def permute(shape, dims):
    from agent_core.ir import Program
    p = Program("permute")
    x = p.add_input("x", shape)
    a = _node(p, "permute", [x], {"dims": list(dims)})
    p.mark_output(a.outputs[0])
    return p, [a.id], lambda t: t.permute(*dims).contiguous()


def detect_decode(small=False):
    """benchmarks/blocks/detect_decode_yolov5.py as imported: every node but the final relabelling
    reshape (the region the planner makes of it)."""
    from agent_core.importers import import_file, load_source
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "blocks", "detect_decode_yolov5.py")
    old = os.environ.get("STITCHCUDA_BLOCKS_SMALL")
    os.environ["STITCHCUDA_BLOCKS_SMALL"] = "1" if small else "0"
    try:
        mod = load_source(path)
        p = import_file(path)
    finally:
        if old is None:
            os.environ.pop("STITCHCUDA_BLOCKS_SMALL", None)
        else:
            os.environ["STITCHCUDA_BLOCKS_SMALL"] = old
    order = p.topo_order()
    ids = order[:-1] if p.nodes[order[-1]].op == "reshape" else order
    model, moved = mod.Model(), {}

    def fn(t):      # moved once: Module.to on every call would be timed as eager's
        if t.device not in moved:
            moved[t.device] = model.to(t.device)
        return moved[t.device](t)
    return p, ids, fn


# name, builder, input shapes, quick
CASES = [
    ("pixel_shuffle_r2", lambda: pixel_shuffle((8, 12, 256, 256), 2), [(8, 12, 256, 256)], True),
    ("pixel_shuffle_r3", lambda: pixel_shuffle((8, 27, 256, 256), 3), [(8, 27, 256, 256)], True),
    ("pixel_shuffle_r4", lambda: pixel_shuffle((8, 48, 256, 256), 4), [(8, 48, 256, 256)], True),
    ("channel_shuffle_nchw", lambda: channel_shuffle((64, 232, 28, 28), 2), [(64, 116, 28, 28)] * 2, True),
    ("channel_shuffle_nhwc", lambda: channel_shuffle((64, 28, 28, 232), 2, channels_last=True),
     [(64, 28, 28, 116)] * 2, False),
    ("permute_0231", lambda: permute((32, 256, 56, 56), (0, 2, 3, 1)), [(32, 256, 56, 56)], True),
    ("detect_decode_yolov5", lambda: detect_decode(), [(16, 3, 80, 80, 85)], True),
]


def run_case(case, args, bw_gbs, emit):
    import torch
    name, builder, shapes, _ = case
    p, ids, fn = builder()
    xs = [torch.randn(s, device="cuda") for s in shapes]
    survey_region(p, ids, fn, xs, {"case": name, "shape": list(shapes[0])}, args, bw_gbs, emit,
                  prefix="layout", check_fn=True)


def main(argv=None) -> int:
    return survey_main(argv, tool="bench_layout", doc=__doc__, cases=CASES, quick="under 3 minutes",
                       run=run_case, widths=(24, 18, 28))


if __name__ == "__main__":
    sys.exit(main())
