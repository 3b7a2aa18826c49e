"""The one line of a message shown where one line fits (bench rows, progress lines, capture errors):
a first line that only introduces the error gets the line that says what went wrong."""
from __future__ import annotations

from agent_core.profile.baselines import _first_line
from agent_core.text import first_line


def test_first_line_of_a_plain_message():
    assert first_line("CUDA out of memory. Tried to allocate 2 GiB\nmore detail") == \
        "CUDA out of memory. Tried to allocate 2 GiB"
    assert first_line("") == "" and first_line(None) == ""


def test_a_header_line_carries_the_error_it_introduces():
    wrapped = ("backend='inductor' raised:\n\nRuntimeError: CUDA error: operation not permitted when "
               "stream is capturing\n\nSet TORCHDYNAMO_VERBOSE=1 for more")
    assert first_line(wrapped) == ("backend='inductor' raised: RuntimeError: CUDA error: operation not "
                                   "permitted when stream is capturing")


def test_a_baseline_error_names_its_type_and_the_real_cause():
    class BackendCompilerFailed(Exception):
        pass
    exc = BackendCompilerFailed("backend='inductor' raised:\nAssertionError: bad stride")
    assert _first_line(exc) == "BackendCompilerFailed: backend='inductor' raised: AssertionError: bad stride"
    assert _first_line(ValueError()) == "ValueError"
