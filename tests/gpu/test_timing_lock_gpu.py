"""On the GPU: under `bench --jobs N` every step of a measurement runs its kernels holding the GPU lock
(profile.timing): the warm-up and the graph capture at least shared, so they never overlap another
problem's timed section, and the replays alone.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_timing_lock_gpu.py
"""
import fcntl

import pytest
import torch

from agent_core.profile import timing

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_warm_up_and_capture_of_a_measurement_hold_the_lock(tmp_path, monkeypatch):
    lock = tmp_path / "t.lock"
    monkeypatch.setenv(timing.TIMING_LOCK_ENV, str(lock))

    def another_problem_could_measure() -> bool:   # another open file description acts as another process
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
    seen = []
    x = torch.ones(1024, device="cuda")

    def fn():
        seen.append(another_problem_could_measure())
        x.mul_(1.0)
    t, how = timing.time_in_graph(fn, trials=3, warmup=1)
    assert how == "graph" and t.trials == 3
    assert len(seen) == 2 and not any(seen)          # the warm-up call and the captured one
    assert another_problem_could_measure()           # released afterwards
