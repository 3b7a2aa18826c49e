"""The end-to-end timing loads the baselines' inputs into the executable first (agent/loop.py
_baseline_inputs_into), so ours and torch's are timed on the same data; where they do not fit the
program (another count or shape), ours keeps the verification's random draws and says so."""
import torch

from agent_core.agent.loop import _baseline_inputs_into


class _Exe:
    """Stands in for program_runtime's Executable: copies inputs into its static tensors."""

    def __init__(self, *shapes):
        self.inputs = [torch.zeros(s) for s in shapes]

    def __call__(self, *xs):
        if len(xs) != len(self.inputs):
            raise ValueError(f"the program takes {len(self.inputs)} inputs, got {len(xs)}")
        for dst, src in zip(self.inputs, xs):
            dst.copy_(src)


class _Emit:
    def __init__(self):
        self.lines = []

    def log(self, text, level="info"):
        self.lines.append((level, text))


def test_the_baselines_inputs_are_what_ours_is_timed_on():
    exe, emit = _Exe((4, 3), (4,)), _Emit()
    xs = [torch.randn(4, 3), torch.arange(4.0)]
    assert _baseline_inputs_into(exe, (None, xs), emit) == "baseline inputs"
    assert all(torch.equal(a, b) for a, b in zip(exe.inputs, xs)) and not emit.lines


def test_inputs_that_do_not_fit_leave_the_random_draws_and_say_so():
    exe, emit = _Exe((4, 3)), _Emit()
    assert _baseline_inputs_into(exe, (None, [torch.randn(4, 3), torch.randn(2)]), emit) == "random draws"
    assert emit.lines and emit.lines[0][0] == "warning" and "random draws" in emit.lines[0][1]
    assert _baseline_inputs_into(exe, None, emit) == "random draws"
