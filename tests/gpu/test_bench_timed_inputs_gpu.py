"""bench times ours on the inputs torch's baselines run on (the file's get_inputs()), not on the
verification's random draws: a cross entropy whose file pads 1/16 of its labels (ignored) is timed with
those labels, where a random attention mask would ignore half the rows a guarded kernel never reads.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_bench_timed_inputs_gpu.py
"""
import json
import textwrap

import pytest
import torch

from tests.programs import cli

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_bench_times_ours_on_the_files_inputs(tmp_path):
    block = tmp_path / "padded_cross_entropy.py"
    block.write_text(textwrap.dedent('''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Model(nn.Module):
            def forward(self, logits, labels, mask):
                labels = torch.where(mask == 1, labels, -100)
                return F.cross_entropy(logits, labels, ignore_index=-100)


        def get_inputs():
            mask = torch.ones(2048, dtype=torch.long)
            mask[-128:] = 0
            return [torch.randn(2048, 8000), torch.randint(0, 8000, (2048,)), mask]


        def get_init_inputs():
            return []
    '''))
    out = tmp_path / "b.jsonl"
    proc = cli("bench", str(block), "--json", str(out), "--no-tune", "--trials", "5", "--no-compile-baselines",
               timeout=600)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["ok"] and rec["correct"], rec
    assert rec["ours_timed_on"] == "baseline inputs", rec
