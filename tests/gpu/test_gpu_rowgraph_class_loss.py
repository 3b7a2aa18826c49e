"""On the GPU, at real sizes: cross entropy as one row-graph kernel (rowpick.py: the label's logit per
row; row totals: the loss's sum and mean), every schedule it takes (warp, block, stream, cluster,
split rows, column tiles for [N, C, H, W]) and every tuning variant, equal to torch (fp32, TF32 off)
at atol = rtol = 1e-4 on 3 draws, the mean deterministic across launches.
(The CPU emulates the same kernels at small sizes: tests/test_rowgraph_class_loss.py.)

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_rowgraph_class_loss.py"""
import pytest
import torch

from tests.programs import nll_program
from tests.test_codegen_class_loss import ce_program, log_softmax_nll_program

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _check(p, ids, classes, params=None, variants=0):
    """The row graph's kernel (and up to `variants` of its tuning variants) against torch on 3 draws."""
    from agent_core.agent.tune import tune_space
    from agent_core.codegen.region_io import region_io
    from agent_core.codegen.rowkernel import generate_multi_reduction
    from agent_core.reference import run_reference
    from agent_core.runtime.launch import load_kernel
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ks = generate_multi_reduction(p, region_io(p, ids), "loss", params)
    kernels = [ks] + [generate_multi_reduction(p, region_io(p, ids), f"loss_{j}", v)
                      for j, v in enumerate(tune_space(ks, limit=variants))]
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ins = [(torch.randn(p.values[v].shape, generator=g) * 3).cuda() if p.values[v].dtype == "float32" else
               torch.randint(0, 2 if p.values[v].name == "mask" else classes, p.values[v].shape, generator=g).cuda()
               for v in p.inputs]
        env = run_reference(p, ins, keep=True)
        for k in kernels:
            loaded = load_kernel(k, p)
            args = [env[v] for v in k.inputs]
            outs = loaded(args)
            for v, got in zip(k.outputs, outs):
                torch.testing.assert_close(got, env[v], atol=1e-4, rtol=1e-4, equal_nan=True,
                                           msg=lambda m, k=k: f"{k.schedule}: {m}")
            if outs[0].numel() == 1:        # the last block adds the rows' shares in a fixed order
                # (bit for bit; a mean over labels all ignored is 0 / 0 = NaN on every launch)
                for _ in range(2):
                    torch.testing.assert_close(loaded(args)[0], outs[0], atol=0, rtol=0, equal_nan=True)
    return ks


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(64, 320), (16, 1001), (8, 32000), (4, 128256), (4096, 32000), (2, 19, 64, 128)],
                         ids=["NC", "odd", "vocab32k_few", "vocab128k_few", "vocab32k_many", "NCHW"])
@pytest.mark.parametrize("weight,ignore,smoothing,mask", [(False, -100, 0.0, True), (True, 1, 0.1, False)],
                         ids=["masked", "weight_ignore_smooth"])
def test_cross_entropy_in_the_row_graph_equals_torch(shape, reduction, weight, ignore, smoothing, mask):
    p, ids = ce_program(shape, reduction, weight, ignore, smoothing, label_mask=mask)
    _check(p, ids, shape[1], variants=3 if reduction == "mean" else 0)


@pytest.mark.parametrize("params", [{"split": 4}, {"cluster": 4, "split": 1}, {"cluster": 1, "split": 1}],
                         ids=["split_row", "cluster", "stream"])
def test_each_long_row_schedule_equals_torch(params):
    p, ids = ce_program((16, 128256), "mean", True, 5, 0.1)
    _check(p, ids, 128256, params)


@pytest.mark.parametrize("shape", [(16, 10), (4, 5, 3, 2), (7,), (4096, 1000)], ids=["NC", "NCd", "C", "big_NC"])
def test_a_lone_nll_loss_equals_torch(shape):
    p, nid = nll_program(shape, "mean", weight=True, ignore_index=1)
    _check(p, [nid], shape[0] if len(shape) == 1 else shape[1])


def test_log_softmax_nll_over_the_channels_equals_torch():
    q, ids = log_softmax_nll_program((8, 19, 128, 256), "mean", weight=True)
    _check(q, ids, 19, variants=3)
