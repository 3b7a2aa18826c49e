"""On the GPU: the end-to-end program writes a pointwise epilogue over the library output it reads last
(conv -> relu: relu's map takes cuDNN's buffer, memory_plan.written_over), runs a slice that only a
library call reads as torch's strided view (no copy kernel), and a pointwise op before a pooling inside
the pooling kernel; each matches the reference on 5 draws, in a CUDA graph.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_in_place_gpu.py
"""
import io

import pytest
import torch
import torch.nn as nn

from agent_core.agent import EventEmitter, optimize
from agent_core.importers import import_nn_module

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 16, 10)

    def forward(self, x):
        h = self.b(torch.relu(self.a(x)))                           # relu: an epilogue written in place
        h = nn.functional.max_pool2d(torch.relu(h), 2)              # relu inside the pooling kernel
        rows = h.flatten(2)                                         # [N, 16, 256]
        return self.fc(rows[:, -1, :])                              # the last row, a strided view


def test_in_place_epilogue_strided_view_and_pooling_prologue_match_the_reference():
    torch.manual_seed(0)
    prog = import_nn_module(Block().eval(), [torch.randn(4, 3, 32, 32)])
    res = optimize(prog, emit=EventEmitter(io.StringIO()), tune=False, time_regions=False, baselines=False,
                   draws=5, trials=5)
    e2e = res.profile["end_to_end"]
    assert e2e["correct"], e2e["verify"]["reason"]
    assert e2e["verify"]["draws"] == 5 and e2e["cuda_graph"]
    assert e2e["memory"]["written_over"], e2e["memory"]             # relu over the first conv's output
    kinds = {r.kind for r in res.program.regions if r.status != "rejected"}
    assert "pooling" in kinds, kinds
    runs = {r.schedule.get("runs") for r in res.program.regions if r.status != "rejected"}
    assert "strided_view" in runs, runs
    bad = [f"{o.region}: {o.reason}" for o in res.outcomes if o.status == "fallback"]
    assert not bad, bad
