"""Library calls' outputs and split-TF32 temporaries in the lifetime-planned arena, on the CPU.

The end-to-end program is built for the CPU (no CUDA graph) from a real imported nn.Module: matmul-
family calls write into their arena slots through torch's out= forms, so slots whose lifetimes do not
overlap share offsets and overlapping ones never do; split-TF32 calls keep their weights' caches only
within the memory budget, else split per call into arena temporaries, else run in fp32, each a
recorded decision; every form still matches the reference.
"""
import torch
import torch.nn as nn

from agent_core.importers import import_nn_module
from agent_core.program_runtime import check_arena
from agent_core.program_runtime.executable import ProgramExecutable
from agent_core.runtime.split_tf32 import split_cat_into, split_into
from agent_core.program_runtime.library_memory import eager_peak_estimate
from agent_core.runtime.split_tf32 import split_tf32


class ResidualMLP(nn.Module):
    """fc1's output stays alive across fc2 (the residual); fc2 and fc3 never live together."""

    def __init__(self, d=64):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = self.fc1(x)
        y = torch.relu(self.fc2(torch.relu(h))) + h
        return self.fc3(torch.tanh(y))


def _program(model=None, shape=(32, 64)):
    torch.manual_seed(0)
    return import_nn_module(model or ResidualMLP(), [torch.randn(*shape)])


def _linear_outputs(p):
    return [n.outputs[0] for n in p.nodes.values() if n.op == "linear"]


def test_library_outputs_share_offsets_only_when_their_lifetimes_do_not_overlap():
    p = _program()
    exe = ProgramExecutable(p, {}, graph=False, device="cpu")
    plan, mem = exe.arena_plan, exe.memory
    l1, l2, l3 = _linear_outputs(p)
    assert {mem.kinds[v] for v in (l1, l2, l3)} == {"library output"}
    s1, s2, s3 = (plan.slots[v] for v in (l1, l2, l3))
    assert s1.overlaps_in_time(s2) and s1.offset != s2.offset          # the residual keeps fc1's alive
    assert not s2.overlaps_in_time(s3) and s2.offset == s3.offset or \
        not s1.overlaps_in_time(s3) and s1.offset == s3.offset          # fc3 reuses a dead slot
    assert check_arena(plan) == []
    assert plan.total_bytes < plan.naive_bytes
    res = exe.verify(draws=3)
    assert res.ok, res.reason
    # the program's output is fc3's, written by torch.addmm(out=) into the arena itself
    out = exe(torch.randn(32, 64))[0]
    lo, hi = exe.arena.data_ptr(), exe.arena.data_ptr() + exe.arena.numel()
    assert lo <= out.data_ptr() < hi
    assert "memory" in plan.to_dict() and plan.to_dict()["memory"]["arena_slots"]["library output"] == 3


def test_split_parts_made_in_place_match_split_tf32():
    torch.manual_seed(1)
    for shape in ((7, 33), (2, 3, 5, 5)):
        t = torch.randn(*shape) * 10
        t.view(-1)[0] = float("inf")
        hi, lo = torch.empty_like(t), torch.empty_like(t)
        split_into(t, hi, lo)
        ref_hi, ref_lo = split_tf32(t)
        assert torch.equal(hi, ref_hi) and torch.equal(lo.isnan(), ref_lo.isnan())
        assert torch.equal(lo[~lo.isnan()], ref_lo[~ref_lo.isnan()])
    x = torch.randn(2, 4, 3, 3)
    dst = torch.empty(2, 12, 3, 3)
    split_cat_into(x, dst, 1, lo_at=1)
    h, low = split_tf32(x)
    assert torch.equal(dst, torch.cat([h, low, h], dim=1))
    split_cat_into(x, dst, 1, lo_at=2)
    assert torch.equal(dst, torch.cat([h, h, low], dim=1))


def _split_program(budget):
    p = _program()
    lin = [n.id for n in p.nodes.values() if n.op == "linear"]
    p.metadata["library_precision"] = {nid: "3xtf32" for nid in lin}
    if budget is not None:
        p.metadata["memory_budget_bytes"] = budget
    return p, lin


def test_split_weights_are_cached_within_the_budget_split_per_call_or_fp32_beyond_it():
    # the weights' caches: 3 x 2 x 64 x 64 x 4 bytes; the activations' split parts 2 x 32 x 64 x 4 each
    roomy, _ = _split_program(1 << 30)
    exe = ProgramExecutable(roomy, {}, graph=False, device="cpu")
    assert {d.weights for d in exe.memory.decisions.values()} == {"cached"}
    assert all(d.runs_as == "3xtf32" for d in exe.memory.decisions.values())
    assert exe.verify(draws=3).ok



def test_split_per_call_between_cached_and_fp32():
    # room for the activations' temporaries and the weights split per call, not for three caches
    per_call, lin = _split_program(None)
    plain = ProgramExecutable(per_call, {}, graph=False, device="cpu").memory
    per_call.metadata["memory_budget_bytes"] = plain.predicted_peak_bytes - 1      # one cache too many
    exe = ProgramExecutable(per_call, {}, graph=False, device="cpu")
    d = exe.memory.decisions
    assert any(x.weights == "split per call" for x in d.values()), {k: x.reason for k, x in d.items()}
    assert exe.memory.predicted_peak_bytes <= exe.memory.budget_bytes
    temps = [v for v, k in exe.memory.kinds.items() if k == "split temporary"]
    assert temps and check_arena(exe.arena_plan) == []
    for n in lin:     # each call's temporaries live for its step only: disjoint calls share bytes
        for v in temps:
            if v.startswith(n + "."):
                s = exe.arena_plan.slots[v]
                assert s.start == s.end
    offsets = {exe.arena_plan.slots[v].offset for v in temps}
    assert len(offsets) < len(temps)          # temporaries of different calls reuse the same bytes
    assert "split per call" in " ".join(x.reason for x in d.values())
    assert exe.verify(draws=3).ok


def test_no_room_runs_split_calls_in_fp32():
    # no room at all: every call runs in fp32, and says why
    tight, lin = _split_program(1)
    exe = ProgramExecutable(tight, {}, graph=False, device="cpu")
    assert {x.runs_as for x in exe.memory.decisions.values()} == {"fp32"}
    assert all("runs in fp32" in x.reason for x in exe.memory.decisions.values())
    assert not [k for k in exe.memory.kinds.values() if k == "split temporary"]
    assert exe.verify(draws=3).ok
    assert exe.arena_plan.to_dict()["memory"]["split_tf32"][lin[0]]["runs_as"] == "fp32"


class ConvChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x))).mean(dim=(2, 3)) @ torch.ones(8, 4)


def test_convolution_split_forms_use_arena_temporaries_and_match_the_reference():
    for form in ("3xtf32", "3xtf32-cat"):
        p = _program(ConvChain(), (2, 3, 12, 12))
        convs = [n.id for n in p.nodes.values() if n.op == "conv2d"]
        p.metadata["library_precision"] = {c: form for c in convs}
        p.metadata["memory_budget_bytes"] = 1 << 30
        exe = ProgramExecutable(p, {}, graph=False, device="cpu")
        kinds = exe.memory.kinds
        want = ".a_cat" if form == "3xtf32-cat" else ".a_hi"
        assert all(any(v == c + want for v in kinds) for c in convs), kinds
        res = exe.verify(draws=3)
        assert res.ok, (form, res.reason)
        # weights split per call: the weight's parts become arena temporaries too
        p.metadata["memory_budget_bytes"] = exe.memory.predicted_peak_bytes - exe.memory.cache_bytes
        exe = ProgramExecutable(p, {}, graph=False, device="cpu")
        assert {d.weights for d in exe.memory.decisions.values()} <= {"split per call", "none"}
        assert exe.verify(draws=3).ok


def test_eager_estimate_counts_activations_not_weights_or_inputs():
    p = _program()
    est = eager_peak_estimate(p)
    act = 32 * 64 * 4
    assert 2 * act <= est <= 4 * act       # fc1's output and one or two more at a time; no weights
