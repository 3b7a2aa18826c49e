"""On the GPU: every real-world block (benchmarks/blocks/) at its real size is a meaningful benchmark:
torch eager takes at least 20 us (otherwise launch overhead is all it measures), and it runs in the
memory the suite promises (inputs and parameters under 4 GB, built on the host first as bench does).

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_blocks_gpu.py -s     (prints each block's time)
"""
import os
import statistics
from pathlib import Path

import pytest
import torch

from agent_core.importers.source import load_source

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BLOCKS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "blocks").glob("*.py"))
MIN_EAGER_US = 20.0
BUDGET_BYTES = 4 * 10 ** 9


def _eager_us(model, inputs, trials: int = 20) -> float:
    """Median of `trials` eager calls, each timed with CUDA events after a cache-flushing write."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # larger than the H200's 60 MiB L2
    times = []
    with torch.no_grad():
        for _ in range(3):
            model(*inputs)
        for _ in range(trials):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


@pytest.mark.parametrize("path", BLOCKS, ids=[p.stem for p in BLOCKS])
def test_block_real_size_is_worth_timing(path):
    assert "STITCHCUDA_BLOCKS_SMALL" not in os.environ, "the test-size override is set: unset it for this run"
    mod = load_source(path)
    torch.manual_seed(0)
    inputs = list(mod.get_inputs())
    torch.manual_seed(0)
    model = mod.Model(*mod.get_init_inputs()).eval()
    held = sum(t.numel() * t.element_size() for t in inputs + list(model.parameters()) + list(model.buffers()))
    assert held <= BUDGET_BYTES, f"{path.name}: {held / 1e9:.2f} GB of inputs and parameters"
    model = model.cuda()
    inputs = [t.cuda() for t in inputs]
    us = _eager_us(model, inputs)
    print(f"{path.stem}: eager {us:.1f} us, {held / 1e6:.0f} MB held")
    assert us >= MIN_EAGER_US, f"{path.name}: torch eager takes {us:.1f} us at the real size, under {MIN_EAGER_US} us"
