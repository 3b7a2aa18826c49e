"""Few long rows spread over the whole GPU: the row graph's `split_row` schedule (codegen/rowsplit.py).

Each row is cut into kSplit chunks. Streamed, phase r - 1 folds round r (every chunk's partial state
published, the row's last block combining them in parallel), the last phase writes the per-element
outputs after waiting for its row's flag. Held (where a chunk fits 32 floats a thread and a row's
chunks fit the SMs), one phase: each block loads its chunk once, and after each round's fold waits for
the row's combined state. Tasks come from a grid-wide ticket, so no block waits for one that has not
started (held: or is not the next claimed).

On the CPU: which shapes take the schedule (from rows, row length and SM count, never a block's
shape), NVRTC sm_90 builds, and the kernel itself, held and streamed, run by the CPU emulator
(agent_core.writer.emulate: g++, every block and thread; a held block waits for the rest of its row
while the emulator starts the next blocks beside it) against torch: max then a pointwise pass (Whisper's log-mel), softmax
(online max and sum of exp), layer_norm (Welford), mean / max / min kept per row, a chain of two
reductions (three phases), a whole-tensor sum beside the rows, ragged lengths (scalar loads, a short
last chunk), a slice read and a transpose written through their views; the workspace's counters are left zeroed and a second launch gives the same bits. The
GPU side: tests/gpu/test_gpu_split_rows.py.
"""
import shutil

import numpy as np
import pytest
import torch

from agent_core.agent.tune import tune_space
from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.reference import run_reference
from tests.programs import kl_terms, row_stats

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
# a small GPU for the default rule: 8 SMs and no launch-bound floor, so small rows already split
SMALL_GPU = {"sm_count": 16, "spread_min_bytes": 0}     # 2 to 5 rows: below half the SMs


def log_mel(shape):
    """Whisper's log-mel normalisation: log10 of the clamped power, floored at each clip's max - 8."""
    p = Program("log_mel")
    x = p.add_input("mel", shape)
    ids = []

    def node(op, ins, attrs=None):
        n = p.add_node(op, ins, attrs or {})
        ids.append(n.id)
        return n.outputs[0]
    lg = node("div_scalar", [node("log", [node("clamp", [x.id], {"min": 1e-10, "max": None})])], {"value": 2.302585092994046})
    peak = node("max", [lg], {"dim": list(range(1, len(shape))), "keepdim": True})
    y = node("div_scalar", [node("add_scalar", [node("maximum", [lg, node("sub_scalar", [peak], {"value": 8.0})])],
                                  {"value": 4.0})], {"value": 4.0})
    p.mark_output(y)
    return p, ids


def row_op(op, shape):
    p = Program(op)
    x = p.add_input("x", shape)
    attrs = {"normalized_shape": [shape[-1]]} if op == "layer_norm" else {"dim": -1}
    n = p.add_node(op, [x.id], attrs)
    p.mark_output(n.outputs[0])
    return p, [n.id]


def centred_variance(shape):
    """mean((x - mean(x))^2) written out: the second reduction reads the first's result (two rounds,
    three phases with the per-element output x - mean)."""
    p = Program("centred")
    x = p.add_input("x", shape)
    m = p.add_node("mean", [x.id], {"dim": [-1], "keepdim": True})
    d = p.add_node("sub", [x.id, m.outputs[0]])
    sq = p.add_node("mul", [d.outputs[0], d.outputs[0]])
    v = p.add_node("mean", [sq.outputs[0]], {"dim": [-1], "keepdim": True})
    p.mark_output(d.outputs[0])
    p.mark_output(v.outputs[0])
    return p, [m.id, d.id, sq.id, v.id]


def kl_total(shape):
    """KL's terms, then their sum over every element (batchmean's numerator) beside the row softmaxes."""
    p, ids = kl_terms(shape)
    s = p.add_node("sum", [p.outputs[0]], {"dim": None, "keepdim": False})
    p.outputs.clear()
    p.mark_output(s.outputs[0])
    return p, [*ids, s.id]


def through_views(shape):
    """A strided slice read through its view before a softmax, a transpose written through its view
    after it (codegen/layout_graph.ViewPrologue, codegen/layout_store.py)."""
    p = Program("viewed")
    x = p.add_input("x", (shape[0], 2 * shape[1]))
    s = p.add_node("slice", [x.id], {"dim": 1, "start": 0, "end": 2 * shape[1], "step": 2})
    sm = p.add_node("softmax", [s.outputs[0]], {"dim": -1})
    t = p.add_node("transpose", [sm.outputs[0]], {"dim0": 0, "dim1": 1})
    p.mark_output(t.outputs[0])
    return p, [s.id, sm.id, t.id]


def masked_front(t):
    """-inf over the first 5000 columns of every row: whole chunks whose partial state is (-inf, 0)."""
    t = t.clone()
    t[..., :5000] = -torch.inf
    return t


def emulate(program, ids, params, draws=2, prep=None):
    """The kernel run twice on the CPU (one launch per call, each with fresh zeroed workspace):
    (ks, [outputs of each call], torch's outputs, workspace after call 1)."""
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import CANARY, guarded, payload
    guard = 64
    ks = generate_kernel(program, ids, name=f"emu_{program.name}", params=params)
    g = torch.Generator().manual_seed(0)
    ins = {v: torch.randn(program.values[v].shape, generator=g) for v in ks.inputs}
    if prep is not None:
        ins = {v: prep(t) for v, t in ins.items()}
    ref = run_reference(program, [ins[v] for v in program.inputs], keep=True)
    outs = [program.values[v] for v in ks.outputs]
    call = [guarded(ins[v].numpy(), guard) for v in ks.inputs]
    call += [guarded(np.full(o.shape, 7.0, np.float32), guard) for o in outs]
    call += [guarded(np.zeros(n, np.float32 if dt == "float32" else np.uint32), guard) for dt, n in ks.workspace]
    results = CpuExecutor().run(ks, [list(call) for _ in range(draws)], guard=guard, timeout_s=120)
    got = []
    for res in results:
        assert all((b[:guard] == CANARY).all() and (b[-guard:] == CANARY).all() for b in res), "wrote outside a buffer"
        got.append([torch.from_numpy(payload(res[len(ks.inputs) + i], guard, np.float32, o.shape).copy())
                    for i, o in enumerate(outs)])
    counters = payload(results[0][-1], guard, np.uint32, (ks.workspace[-1][1],))
    return ks, got, [ref[v] for v in ks.outputs], counters


CASES = {
    "log_mel max then pointwise": (lambda: log_mel((3, 16, 600)), torch.exp),
    "softmax": (lambda: row_op("softmax", (3, 9000)), None),
    "softmax with -inf chunks": (lambda: row_op("softmax", (3, 9000)), masked_front),
    "layer_norm": (lambda: row_op("layer_norm", (2, 8192)), None),
    "mean max min per row": (lambda: row_stats((3, 10000)), None),
    "two chained reductions": (lambda: centred_variance((2, 9001)), None),
    "ragged softmax": (lambda: row_op("log_softmax", (5, 8195)), None),
    "total beside rows": (lambda: kl_total((3, 8200)), None),
    "views before and after": (lambda: through_views((3, 9000)), None),
}
FORMS = {"held": {}, "streamed": {"hold": False}}


@needs_gxx
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CASES)
def test_split_rows_under_cpu_emulation_match_torch(case, form):
    build, prep = CASES[case]
    program, ids = build()
    ks, got, ref, counters = emulate(program, ids, {**SMALL_GPU, **FORMS[form]}, prep=prep)
    assert ks.params["schedule"] == "split_row" and ks.params["split"] >= 2, ks.schedule
    assert ks.params["cached"] == (form == "held") and (ks.params["phases"] == 1 or form == "streamed")
    assert ks.grid[0] == ks.params["phases"] * ks.params["split"] * (program.values[program.inputs[0]].shape[0])
    for g, r in zip(got[0], ref):
        assert torch.allclose(g, r.reshape(g.shape), atol=1e-5, rtol=1e-5, equal_nan=True), \
            (case, (g - r.reshape(g.shape)).abs().max())
    for a, b in zip(got[0], got[1]):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())          # the same bits on a second launch
    assert not counters.any(), counters     # ticket, arrivals, flags all reset for the next launch


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CASES)
def test_split_rows_compile_for_sm_90(case, form):
    program, ids = CASES[case][0]()
    ks = generate_kernel(program, ids, name=f"nvrtc_{program.name}", params={**SMALL_GPU, **FORMS[form]})
    assert ks.params["schedule"] == "split_row"
    compiled = compile_kernel(ks, arch="sm_90")
    assert compiled.spill_bytes == 0 if hasattr(compiled, "spill_bytes") else True


def test_default_split_comes_from_rows_length_and_sms():
    """Streamed, rows below two per SM split into chunks of at least 4096 columns, about 8 chunks per
    SM in all; as many rows as two per SM (half as many as SMs where one block holds the row), or rows
    too short, keep one block (or cluster) per row."""
    streamed = {"sm_count": 132, "hold": False}
    p, ids = log_mel((64, 80, 3000))           # Whisper's 64 clips of 240,000 on an H200
    ks = generate_kernel(p, ids, name="log_mel", params=streamed)
    assert ks.params["schedule"] == "split_row"
    assert ks.params["split"] == 17 and ks.params["phases"] == 2 and ks.grid == (64 * 17 * 2, 1, 1)
    assert "14120" in ks.source                # kChunk: 240,000 / 17 rounded up to a float4
    ks = generate_kernel(p, ids, name="log_mel", params={**streamed, "sm_count": 64})
    assert ks.params["split"] == 8             # a smaller GPU: fewer chunks
    ks = generate_kernel(p, ids, name="log_mel", params={"sm_count": 32})
    assert ks.params["schedule"] != "split_row"   # 64 rows fill 32 SMs twice over
    p, ids = log_mel((264, 80, 3000))          # two rows per SM: one row per block already fills it
    assert generate_kernel(p, ids, name="many", params={"sm_count": 132}).params["schedule"] != "split_row"
    p, ids = row_op("layer_norm", (256, 16384))  # one block holds each row, ~2 rows per SM: read once
    assert generate_kernel(p, ids, name="held", params={"sm_count": 132}).params["schedule"] == "block"
    p, ids = row_op("layer_norm", (64, 16384))   # ... but fewer rows than half the SMs leave most idle
    assert generate_kernel(p, ids, name="held", params={"sm_count": 132}).params["split"] == 4
    p, ids = row_op("layer_norm", (128, 16384))  # one wave of whole rows: no combine phase (H200: 0.76x)
    assert generate_kernel(p, ids, name="held", params={"sm_count": 132}).params["schedule"] == "block"
    p, ids = row_op("softmax", (8, 6000))      # too short to split twice
    assert generate_kernel(p, ids, name="short", params=SMALL_GPU).params["schedule"] != "split_row"
    p, ids = row_op("softmax", (8, 1_000_000))  # 8 rows of a million: one read per phase over the GPU
    ks = generate_kernel(p, ids, name="long", params=streamed)
    assert ks.params["schedule"] == "split_row" and ks.params["split"] == 132 and ks.params["phases"] == 2


def test_a_chunk_is_held_where_it_fits_and_a_row_fits_the_sms():
    """Held by default where each thread's share of a chunk is at most 32 floats with no more chunks
    per row than SMs (every chunk of a row running at once): more chunks than the streamed rule where
    that is what fits, one phase, the row read once. Past that, streamed in phases."""
    p, ids = log_mel((64, 80, 3000))
    ks = generate_kernel(p, ids, name="log_mel", params={"sm_count": 132})
    assert ks.params["cached"] and ks.params["row_reads"] == 1
    assert ks.params["split"] == 30 and ks.params["phases"] == 1 and ks.grid == (64 * 30, 1, 1)  # 8000 a chunk
    assert "constexpr int kItems = 8;" in ks.source        # 8 float4 loads a thread of 256
    ks = generate_kernel(p, ids, name="log_mel", params={"sm_count": 132, "split": 20})
    assert not ks.params["cached"] and ks.params["split"] == 20   # a tuner's split that does not fit: streamed
    p, ids = row_op("softmax", (8, 1_000_000))    # 123 chunks fit, the rule's 132 taken
    ks = generate_kernel(p, ids, name="long", params={"sm_count": 132})
    assert ks.params["cached"] and ks.params["split"] == 132 and ks.params["phases"] == 1
    p, ids = row_op("softmax", (8, 2_000_000))    # 245 chunks would not all run at once on 132 SMs
    ks = generate_kernel(p, ids, name="longer", params={"sm_count": 132})
    assert not ks.params["cached"] and ks.params["phases"] == 2


@needs_gxx
@pytest.mark.parametrize("op,online", [("layer_norm", True), ("softmax", False)])
def test_a_held_row_folds_online_states_in_one_round_or_two_stage_states_in_two(op, online):
    """Held, each round is a wait for the row's other chunks: Welford's mean and variance take one
    round by default; softmax's online max and sum of exp would too, but fold an exp and a rescale per
    element, so its default is the two-stage graph (max, then the sum of exp). The other graph is the
    tuner's alternative. Both emulated against torch."""
    program, ids = row_op(op, (3, 9000))
    ks = generate_kernel(program, ids, name="k", params=SMALL_GPU)
    assert ks.params["cached"] and ks.params["online"] == online and ks.params["rounds"] == (1 if online else 2)
    assert {"held_online": not online, "sm_count": 132} in tune_space(ks, sm_count=132)
    other = {**SMALL_GPU, "held_online": not online}
    assert generate_kernel(program, ids, name="k", params=other).params["rounds"] == (2 if online else 1)
    for params in (SMALL_GPU, other):
        _, got, ref, counters = emulate(program, ids, params)
        torch.testing.assert_close(got[0][0], ref[0].reshape(got[0][0].shape), atol=1e-5, rtol=1e-5)
        assert not counters.any()


@needs_gxx
def test_a_held_row_of_many_chunks_waits_for_them_all():
    """Eight 64-thread chunks per row, each block waiting for the seven others of its row (started
    beside it by the emulator), two rounds (mean, then the centred squares) from the registers."""
    program, ids = centred_variance((3, 2000))
    ks, got, ref, counters = emulate(program, ids, {**SMALL_GPU, "split": 8, "threads_per_row": 64})
    assert ks.params["cached"] and ks.params["split"] == 8 and ks.grid == (24, 1, 1)
    for g, r in zip(got[0], ref):
        assert torch.allclose(g, r.reshape(g.shape), atol=1e-5, rtol=1e-5)
    assert torch.equal(got[0][1], got[1][1]) and not counters.any()


def test_the_tuner_searches_the_split_factor():
    p, ids = log_mel((64, 80, 3000))
    ks = generate_kernel(p, ids, name="log_mel", params={"sm_count": 132})
    space = tune_space(ks, sm_count=132)
    assert {c.get("split") for c in space} >= {60, 15, 1} and {"hold": False, "sm_count": 132} in space, space
    for cand in space:
        alt = generate_kernel(p, ids, name="log_mel", params=cand)
        if cand.get("split") == 1:
            assert alt.params["schedule"] != "split_row"
            continue
        assert alt.params["split"] == cand.get("split", 17)
        # 60 chunks still held; 15 leave 63 floats a thread: streamed, as the hold: False variant
        assert alt.grid[0] == 64 * alt.params["split"] * (1 if alt.params["cached"] else 2)
        assert alt.params["cached"] == (cand.get("split") == 60)
        compile_kernel(alt, arch="sm_90")


def test_the_combine_is_parallel_and_in_a_fixed_order():
    """Streamed, the row's last block folds partials t, t + kBlock, ... per thread, then the block's
    fixed tree: no loop of one thread over every partial; later phases wait on a flag raised by a
    block that took an earlier ticket. Held, every block of the row waits for all of its partials
    and combines them the same way."""
    p, ids = row_op("softmax", (8, 1_000_000))
    src = generate_kernel(p, ids, name="long", params={"sm_count": 132, "hold": False}).source
    assert "for (int k = threadIdx.x; k < kSplit; k += kBlock)" in src
    assert "atomicAdd(&counters[0], 1u)" in src and "while (*flag == 0u)" in src
    assert "blockIdx" not in src.split("__global__", 1)[1]    # tasks come from the ticket only
    held = generate_kernel(p, ids, name="long", params={"sm_count": 132}).source
    assert "for (int k = threadIdx.x; k < kSplit; k += kBlock)" in held and "while (*arrived < kSplit)" in held
    assert "if (last) {" not in held and "blockIdx" not in held.split("__global__", 1)[1]
