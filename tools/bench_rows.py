"""Row-reduction kernels against torch on one GPU: for row shapes drawn from benchmarks/blocks
(softmax / log_softmax / layer_norm / rms_norm over rows of 19 to 128k, with and without a
broadcast bool mask, a few row counts; the activation-statistics columns, the log-mel per-clip
floor and the distillation KL terms, whose rows or columns spread over several blocks), generate our kernel with every schedule variant the tuner
would try (agent_core.agent.tune.tune_space), verify each against the torch reference on 3 draws
(atol = rtol = 1e-4) and time it against torch eager and torch.compile, all with the L2 flushed.

    python3 tools/bench_rows.py --quick          # about 4 minutes on an H200
    python3 tools/bench_rows.py --json rows.jsonl

One table: shape, variant, our us, eager us, torch.compile us, floor us (the region's bytes read
once + written / the measured copy bandwidth), % of floor. A variant that fails (generation,
compile, launch, verification) prints its error in its row and the run goes on. Needs torch and
cupy only (no PySide6).
"""
from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.kernel_survey import main as survey_main, survey_region  # noqa: E402

F32_MIN = -3.4028234663852886e38   # torch.finfo(float32).min, what HF models fill masked scores with


# name, op, x shape, mask ("causal" over the last two dims, broadcast over the leading ones), quick
CASES = [
    ("softmax_vit_197", "softmax", (12 * 64, 197, 197), None, False),   # rows of 197: scalar loads
    ("softmax_19", "softmax", (65536, 19), None, False),
    ("softmax_128", "softmax", (262144, 128), None, False),
    ("softmax_1024", "softmax", (98304, 1024), None, False),
    ("softmax_1024_causal", "softmax", (8, 12, 1024, 1024), "causal", True),   # causal_softmax_gpt2
    ("softmax_2048_causal", "softmax", (1, 32, 2048, 2048), "causal", True),   # alibi_causal_softmax_bloom
    ("softmax_4096", "softmax", (8192, 4096), None, False),
    ("softmax_16384", "softmax", (2048, 16384), None, False),
    ("log_softmax_32000", "log_softmax", (1024, 32000), None, False),
    ("log_softmax_50257", "log_softmax", (1024, 50257), None, True),
    ("log_softmax_128256", "log_softmax", (256, 128256), None, False),
    ("softmax_128256_few_rows", "softmax", (64, 128256), None, False),
    ("layer_norm_768", "layer_norm", (8192, 768), None, False),
    ("layer_norm_4096", "layer_norm", (8192, 4096), None, False),
    ("rms_norm_128", "rms_norm", (131072, 128), None, True),
    ("rms_norm_4096", "rms_norm", (8192, 4096), None, False),
    # activation_stats_observer_llama7b: mean, max, min over 4096 tokens (split columns)
    ("stats_llama7b_dim0", "stats_dim0", (4096, 4096), None, True),
    # log_mel_normalize_whisper: 64 clips, each floored at its own max - 8 (a cluster per clip)
    ("log_mel_whisper", "log_mel", (64, 80, 3000), None, True),
    # kl_div_distill_distilbert: log_softmax and softmax of two rows of 30522 (a cluster per row)
    ("kl_terms_distilbert", "kl_terms", (2048, 30522), None, True),
    # cross_entropy_llama2_32k: labels masked to -100, log_softmax -> nll_loss (mean), one class-loss kernel
    ("cross_entropy_llama2_32k", "cross_entropy", (4096, 32000), None, True),
    # rmsnorm_residual_llama7b: residual = hidden + residual, then rms_norm with a weight; both returned
    ("rmsnorm_residual_llama7b", "rms_residual", (4096, 4096), None, True),
]


def build(op: str, shape, mask, device: str = "cuda"):
    """The program (x [-> / 8 -> where(mask, ., min)] -> op), its region's node ids, and the same
    computation as a torch function of the program's inputs (weights and the mask bound in, on
    `device`)."""
    import numpy as np
    import torch
    from agent_core.ir import Program
    if op in BLOCKS:
        return BLOCKS[op](shape)
    p = Program(f"{op}_{'x'.join(map(str, shape))}")
    x = p.add_input("x", shape)
    ids, cur = [], x.id
    mask_t = None
    if mask == "causal":
        seq_q, seq_k = shape[-2], shape[-1]
        tril = np.tril(np.ones((seq_q, seq_k), dtype=bool)).reshape((1,) * (len(shape) - 2) + (seq_q, seq_k))
        m = p.add_parameter("causal", data=tril, constant=True)
        fill = p.add_parameter("fill", data=np.array(F32_MIN, dtype=np.float32), constant=True)
        n = p.add_node("div_scalar", [cur], {"value": 8.0})
        ids.append(n.id)
        w = p.add_node("where", [m.id, n.outputs[0], fill.id])
        ids.append(w.id)
        cur = w.outputs[0]
        mask_t = torch.from_numpy(tril).to(device)
    attrs, ins = {"dim": -1}, [cur]
    weight = bias = None
    cols = shape[-1]
    if op in ("layer_norm", "rms_norm"):
        attrs = {"normalized_shape": [cols], "eps": 1e-5 if op == "layer_norm" else 1e-6}
        wdata = (1.0 + 0.1 * np.random.default_rng(0).standard_normal(cols)).astype(np.float32)
        ins.append(p.add_parameter("weight", data=wdata).id)
        weight = torch.from_numpy(wdata).to(device)
        if op == "layer_norm":
            bdata = (0.1 * np.random.default_rng(1).standard_normal(cols)).astype(np.float32)
            ins.append(p.add_parameter("bias", data=bdata).id)
            bias = torch.from_numpy(bdata).to(device)
    n = p.add_node(op, ins, attrs)
    ids.append(n.id)
    p.mark_output(n.outputs[0])

    def fn(t):
        if mask_t is not None:
            t = torch.where(mask_t, t / 8.0, F32_MIN)
        if op == "softmax":
            return torch.softmax(t, dim=-1)
        if op == "log_softmax":
            return torch.log_softmax(t, dim=-1)
        if op == "layer_norm":
            return torch.nn.functional.layer_norm(t, (cols,), weight, bias, 1e-5)
        return torch.nn.functional.rms_norm(t, (cols,), weight, 1e-6)
    return p, ids, fn


def _chain(p, steps, ids):
    """Add (op, inputs, attrs) nodes in order; an input that is an int names an earlier step's output."""
    outs = []
    for op, ins, attrs in steps:
        n = p.add_node(op, [outs[i] if isinstance(i, int) else i for i in ins], attrs)
        ids.append(n.id)
        outs.append(n.outputs[0])
    return outs


def _stats_dim0(shape):
    """activation_stats_observer: the per-channel mean, max and min over the tokens (dim 0)."""
    from agent_core.ir import Program
    p = Program(f"stats_{'x'.join(map(str, shape))}")
    x, ids = p.add_input("x", shape), []
    for o in _chain(p, [(op, [x.id], {"dim": [0]}) for op in ("mean", "max", "min")], ids):
        p.mark_output(o)
    return p, ids, lambda t: (t.mean(0), t.amax(0), t.amin(0))


def _log_mel(shape):
    """log_mel_normalize_whisper: log10 of the clamped power, floored at each clip's max - 8, (x + 4) / 4."""
    from agent_core.ir import Program
    import torch
    p = Program(f"log_mel_{'x'.join(map(str, shape))}")
    x, ids = p.add_input("x", shape), []
    outs = _chain(p, [("clamp", [x.id], {"min": 1e-10, "max": None}), ("log", [0], {}),
                      ("div_scalar", [1], {"value": math.log(10.0)}),
                      ("max", [2], {"dim": [1, 2], "keepdim": True}), ("sub_scalar", [3], {"value": 8.0}),
                      ("maximum", [2, 4], {}), ("add_scalar", [5], {"value": 4.0}),
                      ("div_scalar", [6], {"value": 4.0})], ids)
    p.mark_output(outs[-1])

    def fn(t):
        s = torch.log(t.clamp(min=1e-10)) / math.log(10.0)
        return (torch.maximum(s, s.amax(dim=(1, 2), keepdim=True) - 8.0) + 4.0) / 4.0
    return p, ids, fn


def _kl_terms(shape, temperature: float = 2.0):
    """kl_div_distill: softmax(teacher / T) * (log softmax(teacher / T) - log_softmax(student / T))."""
    from agent_core.ir import Program
    import torch
    p = Program(f"kl_terms_{'x'.join(map(str, shape))}")
    s, t, ids = p.add_input("student", shape), p.add_input("teacher", shape), []
    outs = _chain(p, [("div_scalar", [s.id], {"value": temperature}), ("log_softmax", [0], {"dim": -1}),
                      ("div_scalar", [t.id], {"value": temperature}), ("softmax", [2], {"dim": -1}),
                      ("max_scalar", [3], {"value": 1e-30}), ("log", [4], {}), ("sub", [5, 1], {}),
                      ("mul", [3, 6], {})], ids)
    p.mark_output(outs[-1])

    def fn(a, b):
        q = torch.softmax(b / temperature, dim=-1)
        return q * (torch.log(q.clamp(min=1e-30)) - torch.log_softmax(a / temperature, dim=-1))
    return p, ids, fn


def _cross_entropy(shape):
    """cross_entropy_llama2: labels = where(mask == 1, labels, -100), then log_softmax -> nll_loss (mean)."""
    from agent_core.ir import Program
    import torch
    import torch.nn.functional as F
    p = Program(f"cross_entropy_{'x'.join(map(str, shape))}")
    x = p.add_input("logits", shape)
    t = p.add_input("labels", shape[:1], "int64", init={"kind": "randint", "low": 0, "high": shape[1]})
    m = p.add_input("mask", shape[:1], "int64", init={"kind": "randint", "low": 0, "high": 2})
    ids = []
    outs = _chain(p, [("full_like", [m.id], {"fill_value": 1}), ("eq", [m.id, 0], {}),
                      ("full_like", [t.id], {"fill_value": -100}), ("where", [1, t.id, 2], {}),
                      ("log_softmax", [x.id], {"dim": 1}),
                      ("nll_loss", [4, 3], {"reduction": "mean", "ignore_index": -100})], ids)
    p.mark_output(outs[-1])
    return p, ids, lambda a, b, c: F.cross_entropy(a, torch.where(c == 1, b, -100), ignore_index=-100)


def _rms_residual(shape, eps: float = 1e-5):
    """rmsnorm_residual_llama7b: residual = hidden + residual; weight * residual * rsqrt(mean(residual^2) + eps)."""
    import numpy as np
    import torch
    from agent_core.ir import Program
    p = Program(f"rms_residual_{'x'.join(map(str, shape))}")
    h, r = p.add_input("hidden", shape), p.add_input("residual", shape)
    wdata = (1.0 + 0.1 * np.random.default_rng(0).standard_normal(shape[-1])).astype(np.float32)
    w = p.add_parameter("weight", data=wdata)
    ids = []
    outs = _chain(p, [("add", [h.id, r.id], {}), ("square", [0], {}), ("mean", [1], {"dim": [-1], "keepdim": True}),
                      ("add_scalar", [2], {"value": eps}), ("rsqrt", [3], {}), ("mul", [0, 4], {}),
                      ("mul", [w.id, 5], {})], ids)
    p.mark_output(outs[-1])
    p.mark_output(outs[0])
    wt = {}                                   # the weight on the inputs' device, copied once

    def fn(a, b):
        if a.device not in wt:
            wt[a.device] = torch.from_numpy(wdata).to(a.device)
        res = a + b
        return wt[a.device] * (res * torch.rsqrt(res.pow(2).mean(-1, keepdim=True) + eps)), res
    return p, ids, fn


BLOCKS = {"stats_dim0": _stats_dim0, "log_mel": _log_mel, "kl_terms": _kl_terms, "cross_entropy": _cross_entropy,
          "rms_residual": _rms_residual}


def run_case(case, args, bw_gbs, emit):
    import torch
    from agent_core.reference import draw
    name, op, shape, mask, _ = case
    p, ids, fn = build(op, shape, mask)
    gen = torch.Generator().manual_seed(0)     # integer inputs (labels, masks) as their init says
    xs = [4.0 * torch.randn(p.values[v].shape, device="cuda") if p.values[v].dtype == "float32"
          else draw(p.values[v].shape, p.values[v].dtype, p.values[v].init, gen).cuda() for v in p.inputs]
    survey_region(p, ids, fn, xs, {"case": name, "shape": list(shape), "mask": mask}, args, bw_gbs, emit,
                  prefix="rows")


def main(argv=None) -> int:
    return survey_main(argv, tool="bench_rows", doc=__doc__, cases=CASES, quick="about 4 minutes", run=run_case)


if __name__ == "__main__":
    sys.exit(main())
