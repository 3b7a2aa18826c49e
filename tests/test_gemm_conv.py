"""The tile GEMM's convolution form (codegen/gemm_conv.py): a conv1d / 2d / 3d and the pointwise ops after
it as one implicit-GEMM kernel (grouped: one GEMM per group). Its variants compile through NVRTC for
sm_90 without warnings or spills; the same body with plain-C++ tensor-core helpers runs in the CPU
emulator and matches torch on ragged shapes, strides, padding, dilation and groups; what it does not take
is refused with the reason; the planner names the form for a conv + epilogue region and `optimize --cpu`
compiles it among the tuning variants."""
from __future__ import annotations

import re

import numpy as np
import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from tests.programs import cli, emulated

torch = pytest.importorskip("torch")
FORM = {"form": "gemm-3xtf32"}


def conv_program(x_shape, cout, kernel, *, stride=1, padding=0, dilation=1, groups=1, bias=True, seed=0,
                 epilogue=True):
    """x -> conv{d}d (+ bias) -> relu -> * s (s broadcast per channel, [Cout, 1, ...]) -> tanh; weights
    drawn as torch's layers draw them."""
    d = len(x_shape) - 2
    p = Program(f"conv{d}d_epi")
    x = p.add_input("x", x_shape)
    rng = np.random.default_rng(seed)
    cin = x_shape[1]
    bound = 1 / np.sqrt(cin // groups * np.prod(kernel))

    def init(shape):
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)
    ins = [x.id, p.add_parameter("w", init((cout, cin // groups, *kernel))).id]
    if bias:
        ins.append(p.add_parameter("b", init(cout)).id)
    y = p.add_node(f"conv{d}d", ins, {"stride": [stride] * d, "padding": padding if isinstance(padding, str)
                                      else [padding] * d, "dilation": [dilation] * d, "groups": groups}).outputs[0]
    if not epilogue:
        p.mark_output(y)
        return p
    r = p.add_node("relu", [y]).outputs[0]
    s = p.add_parameter("s", rng.standard_normal((cout,) + (1,) * d).astype(np.float32))
    m = p.add_node("mul", [r, s.id]).outputs[0]
    p.mark_output(p.add_node("tanh", [m]).outputs[0])
    return p


@pytest.mark.parametrize("x_shape,cout,kernel,kw,params", [
    ((2, 3, 10, 9), 16, (3, 3), {"padding": 1}, {}),                          # RGB input, K = 27
    ((3, 5, 11), 20, (4,), {"stride": 2, "padding": 3, "dilation": 2}, {}),  # ragged Cout, strided, dilated
    ((1, 2, 5, 6, 7), 8, (3, 2, 3), {"padding": 1}, {"block_m": 64, "warps_m": 2}),
    ((2, 8, 6, 7), 40, (1, 1), {"bias": False}, {"block_k": 16, "stages": 4}),
    ((2, 4, 9, 8), 24, (3, 3), {"padding": "same", "dilation": 2}, {"block_m": 256, "warps_m": 8}),
    ((2, 6, 9, 8), 16, (3, 3), {"padding": 1, "groups": 2}, {}),              # groups of 8 channels
    ((1, 12, 7, 6, 5), 48, (2, 2, 2), {"groups": 3, "stride": 2}, {"block_m": 64, "warps_m": 2}),
    ((2, 3, 7, 6), 8, (2, 2), {"padding": "same"}, {"block_k": 8}),          # no padding before, the last window past the end
    ((1, 2, 9, 10), 8, (7, 7), {"padding": 3}, {}),       # 49 taps: tested by position, past the bit mask's 32
])
def test_emulated_conv_matches_torch(x_shape, cout, kernel, kw, params):
    p = conv_program(x_shape, cout, kernel, **kw)
    ks = generate_kernel(p, list(p.nodes), name="conv_emu", params={**FORM, "portable": True, **params})
    assert ks.kind == "gemm" and "implicit-GEMM convolution" in ks.schedule
    for draw in range(2):
        torch.manual_seed(draw)
        got, want = emulated(p, ks, [torch.randn(x_shape)])
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_emulated_conv_alone_writes_the_conv_and_its_bias():
    """No epilogue op: the kernel stores conv + bias in torch's layout (grid of several row tiles)."""
    p = conv_program((3, 3, 12, 12), 12, (3, 3), stride=2, epilogue=False)
    from agent_core.codegen.gemm_mma import generate_gemm
    from agent_core.codegen.region_io import region_io
    ks = generate_gemm(p, region_io(p, list(p.nodes)), "conv_alone", {"portable": True, "block_m": 64, "warps_m": 2})
    assert ks.grid[0] == 2 and ks.grid[1] == 1     # 3 x 5 x 5 = 75 rows: two 64-row tiles along x
    torch.manual_seed(0)
    got, want = emulated(p, ks, [torch.randn(3, 3, 12, 12)])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,cout,kernel,params", [
    ((128, 3, 32, 32), 16, (3, 3), {}),            # level 2's RGB convolutions
    ((64, 8, 16, 32, 32), 32, (3, 3, 3), {}),      # a 3-D convolution over 8 channels
    ((16, 64, 28, 28), 128, (3, 3), {}),           # a wide one: the square tiles
    ((8, 16, 100), 64, (5,), {"block_m": 256, "warps_m": 8}),
    ((32, 240, 28, 28), 240, (1, 1), {"groups": 3}),    # ShuffleNet's grouped 1x1
    ((32, 64, 28, 28), 64, (3, 3), {"groups": 8}),      # groups of 8 channels
])
def test_conv_compiles_for_sm90_without_warnings_or_spills(x_shape, cout, kernel, params):
    params = dict(params)
    p = conv_program(x_shape, cout, kernel, padding=1, groups=params.pop("groups", 1))
    ks = generate_kernel(p, list(p.nodes), name="conv_gemm", params={**FORM, **params})
    assert "mma.sync.aligned.m16n8k8" in ks.source and "cp.async" in ks.source
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0, c.log
    assert [ln for ln in c.log.splitlines() if "warning" in ln] == []


def test_what_the_implicit_gemm_does_not_take_is_refused_with_the_reason():
    depthwise = conv_program((2, 8, 8, 8), 8, (3, 3), groups=8)    # one output channel a group
    with pytest.raises(CodegenError, match="1 output channel.s. per group .groups=8."):
        generate_kernel(depthwise, list(depthwise.nodes), name="g", params=FORM)
    p = Program("conv_then_sum")
    x = p.add_input("x", (2, 3, 8, 8))
    w = p.add_parameter("w", np.ones((4, 3, 3, 3), np.float32))
    y = p.add_node("conv2d", [x.id, w.id], {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1],
                                            "groups": 1}).outputs[0]
    p.mark_output(p.add_node("sum", [y], {"dim": [-1], "keepdim": False}).outputs[0])
    with pytest.raises(CodegenError, match="pointwise ops only"):
        generate_kernel(p, list(p.nodes), name="r", params=FORM)


def test_cli_plans_and_compiles_the_implicit_gemm_form(tmp_path):
    src = tmp_path / "conv.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "class Model(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n        self.conv = nn.Conv2d(3, 16, 3)\n"
                   "    def forward(self, x):\n        return torch.relu(self.conv(x)) * 0.5\n"
                   "def get_inputs(): return [torch.randn(4, 3, 20, 20)]\ndef get_init_inputs(): return []\n")
    assert cli("import", str(src), "-o", str(tmp_path / "conv.json")).returncode == 0
    r = cli("plan", str(tmp_path / "conv.json"))
    said = "one implicit-GEMM kernel (gemm-3xtf32, the input's patches gathered"
    assert r.returncode == 0 and said in r.stdout, r.stdout + r.stderr
    r = cli("optimize", str(tmp_path / "conv.json"), "--cpu", "-o", str(tmp_path / "out"))
    assert r.returncode == 0 and "the tile GEMM form among them" in r.stdout, r.stdout + r.stderr


def test_cli_optimize_cpu_compiles_a_compute_bound_convolution_alone_as_the_implicit_gemm(tmp_path):
    """A convolution followed by a softmax over its channels is a region of its own: compute-bound, it
    gets the implicit GEMM (to be timed against cuDNN on a GPU); a memory-bound one stays cuDNN's."""
    src = tmp_path / "lone.py"
    src.write_text("import torch, torch.nn as nn\n"
                   "class Model(nn.Module):\n"
                   "    def __init__(self):\n        super().__init__()\n"
                   "        self.wide, self.thin = nn.Conv2d(16, 32, 3), nn.Conv2d(32, 2, 1)\n"
                   "    def forward(self, x):\n"
                   "        return torch.softmax(self.thin(torch.softmax(self.wide(x), dim=1)), dim=1)\n"
                   "def get_inputs(): return [torch.randn(4, 16, 20, 20)]\ndef get_init_inputs(): return []\n")
    r = cli("optimize", str(src), "--cpu", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    outcomes = {o["region"]: o for o in json.loads((tmp_path / "out" / "profile.json").read_text())["regions"]}
    plan = {e["region"]: e for e in map(json.loads, (tmp_path / "out" / "events.jsonl").read_text().splitlines())
            if e["event"] == "region-proposed"}
    # the two convolutions' regions, by the node each reason starts with (imported in forward's order)
    wide = [rid for rid, e in plan.items() if e["reason"].split()[0] == "conv2d"]
    thin = [rid for rid, e in plan.items() if e["reason"].split()[0] == "conv2d_1"]
    assert len(wide) == 1 and len(thin) == 1, {rid: e["reason"] for rid, e in plan.items()}
    assert "times it as one implicit-GEMM kernel" in plan[wide[0]]["reason"]
    assert outcomes[wide[0]]["status"] == "compiled", outcomes[wide[0]]
    assert "the implicit-GEMM convolution and the direct one" in outcomes[wide[0]]["reason"], outcomes[wide[0]]
    assert outcomes[thin[0]]["status"] == "library" and "cuDNN" in outcomes[thin[0]]["reason"], outcomes[thin[0]]


def test_keeping_the_implicit_gemm_drops_the_convolutions_library_choices():
    """When a region keeps our kernel, the convolution's cuDNN precision and layout choices no longer
    apply (nothing would undo a channels-last conversion meant for a call that no longer runs)."""
    from types import SimpleNamespace

    from agent_core.agent.gemm_form import keep
    from agent_core.runtime.split_tf32 import CHANNELS_LAST, TF32X3_CAT
    p = conv_program((2, 8, 10, 10), 16, (3, 3))
    conv = next(n for n in p.nodes.values() if n.op == "conv2d")
    p.metadata["library_precision"] = {conv.id: TF32X3_CAT}
    p.metadata["library_layout"] = {conv.id: CHANNELS_LAST}
    events = []
    agent = SimpleNamespace(program=p, _params={}, ev=SimpleNamespace(emit=lambda kind, **e: events.append((kind, e))))
    ks = generate_kernel(p, list(p.nodes), name="keep", params=FORM)
    keep(agent, SimpleNamespace(id="r1"), ks)
    assert p.metadata["library_precision"] == {} and p.metadata["library_layout"] == {}
    (kind, e), = events
    assert kind == "precision" and e["chosen"] == "gemm-3xtf32" and TF32X3_CAT in e["reason"]


@pytest.mark.parametrize("d", [3, 7, 9, 25, 27, 49, 125, 343, 64])
def test_the_gathers_division_by_the_tap_count_is_exact_over_its_range(d):
    """gemm_conv.divide's multiply-and-shift (or shift, or plain division) equals x // d for every x below
    its limit, the largest column index a gather forms."""
    from agent_core.codegen.gemm_conv import divide
    if d & (d - 1):        # the gather's ranges get the multiply, not the division it replaces
        assert "*" in divide("x", d, 2000), divide("x", d, 2000)
    for limit in (100, 2000, 40000):
        expr = divide("x", d, limit)
        x = np.arange(limit, dtype=np.uint64)
        if "*" in expr:
            m, s = (int(t) for t in expr.replace("((x * ", "").replace("u) >> ", " ").rstrip(")").split())
            assert int(x[-1]) * m < 1 << 32
            got = (x * np.uint64(m)) >> np.uint64(s)
        elif ">>" in expr:
            got = x >> np.uint64(int(expr.split(">> ")[1].rstrip(")")))
        else:
            assert expr == f"(x / {d}u)"
            continue
        assert np.array_equal(got, x // np.uint64(d)), expr


def test_the_gather_reads_a_tap_table_and_the_epilogue_reads_a_channel_operand_at_its_column():
    """What keeps the implicit GEMM's instructions down (level 2's 7: 5.84 -> 3.94 ms on an H100), as the
    generated source shows it: no division chain per spatial dim in the gather (one multiply-and-shift
    by the tap count, a table read); a padded 3x3's bounds by the thread's bit mask; an unpadded one with
    no bounds test; the per-channel scale read at the tile's column, not by dividing the flat index."""
    def gather(src):
        return src[src.index("auto load_tile"):src.index("const int KT")]
    p = conv_program((2, 3, 10, 9), 16, (3, 3), padding=1)
    padded = generate_kernel(p, list(p.nodes), name="c", params=FORM).source
    q = conv_program((2, 3, 10, 9), 16, (3, 3))
    plain = generate_kernel(q, list(q.nodes), name="c", params=FORM).source
    for src in (padded, plain):
        g = gather(src)
        assert "atap[t]" in g and not re.search(r"[%/] 3u?\b", g), g      # no % 3 or / 3 per kernel dim
        assert re.search(r"in\d\[\(col\)\]", src), "the per-channel scale is read at the column"
    assert "(amask >> t) & 1u" in gather(padded)
    assert "amask" not in plain and "ao0" not in gather(plain)
