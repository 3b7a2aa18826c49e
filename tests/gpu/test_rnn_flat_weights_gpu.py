"""On the GPU: an LSTM runs on one flat weight buffer in cuDNN's layout, as torch.nn's LSTM does after
flatten_parameters; with separate weight tensors every call first copied them into a new buffer, a
temporary the size of all the weights that eager's peak does not have.

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_rnn_flat_weights_gpu.py
"""
import io

import pytest
import torch
import torch.nn as nn

from agent_core.agent import EventEmitter, optimize
from agent_core.importers import import_nn_module
from agent_core.profile.peak_memory import fused_of, peak_memory_record

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MIB = 1 << 20


class LastStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 256, num_layers=3, batch_first=True)     # about 5 MiB of weights

    def forward(self, x):
        out, _ = self.lstm(x)
        return out[:, -1, :]


def test_an_lstm_runs_on_one_flat_weight_buffer_and_allocates_no_copy_of_it():
    torch.manual_seed(0)
    model, x = LastStep().eval(), torch.randn(8, 12, 16)
    res = optimize(import_nn_module(model, [x]), emit=EventEmitter(io.StringIO()), tune=False,
                   time_regions=False, baselines=False, draws=3, trials=3)
    e2e = res.profile["end_to_end"]
    assert e2e["correct"], e2e["verify"]["reason"]
    exe = res.executable
    node = next(n for n in res.program.nodes.values() if n.op == "lstm")
    weights = [exe.params[v] for v in node.inputs[3:]]
    assert len({w.untyped_storage().data_ptr() for w in weights}) == 1          # one buffer
    weight_bytes = sum(w.numel() * 4 for w in weights)
    assert weight_bytes > 4 * MIB
    fused, graph = fused_of(exe), exe.graph is not None
    rec = peak_memory_record(res.program, fused, graph, model.cuda(), [x.cuda()])
    assert rec["peak_mem_ours_bytes"] <= rec["peak_mem_eager_bytes"] + MIB, rec
