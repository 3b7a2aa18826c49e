"""tools/region_variants.py times each region on the values it reads when the program runs on the file's
own get_inputs(), its buffers as the module builds them: a causal mask is the module's tril, not random
booleans, and a cross entropy's padded labels are the file's (a guarded kernel's traffic depends on
both). On the CPU: the values it would feed, for two blocks at their toy sizes."""
import sys
from pathlib import Path

import torch

from agent_core.importers import import_file
from agent_core.rewrites import rewrite_program

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from region_variants import file_values  # noqa: E402


def _values(block, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_BLOCKS_SMALL", "1")
    path = str(ROOT / "benchmarks" / "blocks" / block)
    program = rewrite_program(import_file(path), check=False).program
    return program, file_values(program, path, device="cpu")


def test_a_causal_mask_is_the_modules_own(monkeypatch):
    program, values = _values("causal_softmax_gpt2.py", monkeypatch)
    mask = next(values[v.id] for v in program.values.values() if v.dtype == "bool" and len(v.shape) == 4)
    seq = mask.shape[-1]
    assert torch.equal(mask.view(seq, seq), torch.tril(torch.ones(seq, seq, dtype=torch.bool)))


def test_padded_labels_are_the_files(monkeypatch):
    program, values = _values("cross_entropy_llama2_32k.py", monkeypatch)
    mask = values[program.inputs[2]]
    assert mask.dtype == torch.int64 and (mask == 0).float().mean().item() == 1 / 16
