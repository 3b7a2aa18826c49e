"""A sum of softmax(t) * v along the row, v made of log_softmaxes, first-pass values and per-row values
(KL divergence, soft-label cross entropy, entropy), folds in t's own pass as one online state (the
row graph's softdot: running max, sum of exp and exp-weighted sum of v): a streamed row is read once,
not once for t's statistics and again for the sum. Each kernel, emulated on the CPU, matches torch,
special values included; a v that needs the row's statistics per element keeps the second pass."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.importers import import_nn_module
from agent_core.planner import plan_program
from agent_core.reference import run_reference
from agent_core.rewrites import rewrite_program
from agent_core.rewrites.loss_formulas import FLT_MIN
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx
from tests.test_codegen_split_rows import kl_total

# rows short enough for the emulator, streamed as a long row would be (no warp or block schedule)
STREAMED = {"warp_max_cols": 16, "register_max_cols": 64}


class KL(nn.Module):
    def forward(self, s, t):
        return F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean") * 4


class SoftCrossEntropy(nn.Module):
    def forward(self, s, t):
        return -(F.softmax(t / 0.04, -1) * F.log_softmax(s / 0.1, -1)).sum(-1).mean()


class Entropy(nn.Module):
    def forward(self, s, t):
        return -(torch.softmax(s, -1) * torch.log_softmax(s, -1)).sum(-1)


class WeightedMean(nn.Module):
    """softmax(t) times a first-pass value and a per-row one, averaged along the row."""
    def forward(self, s, t):
        return (torch.softmax(t, -1) * (s * s - t.amax(-1, keepdim=True))).mean(-1)


class ProductOfProbabilities(nn.Module):
    """sum p * q: q = exp(log_softmax(s)) needs s's statistics per element, so a second pass stays."""
    def forward(self, s, t):
        return (torch.softmax(t, -1) * torch.exp(torch.log_softmax(s, -1))).sum(-1)


def _region(module, shape=(6, 300)):
    s, t = torch.randn(*shape) * 3, torch.randn(*shape) * 3
    p = rewrite_program(import_nn_module(module, [s, t])).program
    [region] = [r for r in plan_program(p).active if any(p.nodes[n].op == "softmax" for n in r.nodes)]
    return p, region


def _kernel_output(p, region, ins, params=STREAMED):
    """The region's kernel, emulated on the CPU on `ins`: the program's output it writes."""
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, region, env, params=params)
    return outs[p.outputs[0]]


def _special(shape=(6, 300)):
    """Draws with a masked (-inf) teacher entry, a row of +inf, a NaN and an all -inf row."""
    s, t = torch.randn(*shape) * 3, torch.randn(*shape) * 3
    t[0, :7] = float("-inf")
    t[1, 5] = float("inf")
    s[2, 9] = float("nan")
    t[3] = float("-inf")
    return s, t


@needs_gxx
@pytest.mark.parametrize("module", [KL, SoftCrossEntropy, Entropy, WeightedMean], ids=lambda m: m.__name__)
def test_a_softmax_weighted_sum_reads_the_streamed_row_once_and_matches_torch(module):
    p, region = _region(module())
    ks = generate_kernel(p, list(region.nodes), name="sd", params=STREAMED)
    assert ks.params["schedule"] == "stream" and "fold_block_softdot" in ks.source
    assert ks.params["rounds"] == 1 and "the row read 1 times" in ks.schedule
    g = torch.Generator().manual_seed(0)
    draws = [[torch.randn(6, 300, generator=g) * 3 for _ in range(2)] for _ in range(2)]
    for ins in draws + ([list(_special())] if module is not KL else []):
        env = run_reference(p, ins, keep=True)
        _, outs = _emulate_region(p, region, env, params=STREAMED)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v], rtol=1e-4, atol=1e-4, equal_nan=True)
    want = module()(*ins)
    torch.testing.assert_close(outs[p.outputs[0]], want, rtol=1e-4, atol=1e-4, equal_nan=True)


@needs_gxx
@pytest.mark.parametrize("module", [KL, Entropy], ids=lambda m: m.__name__)
def test_a_row_split_in_chunks_combines_the_chunks_softdot_states(module):
    """Few long rows are cut into chunks over the GPU (rowsplit.py): streamed, each chunk's (m, s, w)
    is published and the row's last block combines them; emulated, equal to torch. Held in registers
    (two rounds from the registers, no softdot state), equal too."""
    p, region = _region(module())
    params = {**STREAMED, "split": 3, "hold": False}
    ks = generate_kernel(p, list(region.nodes), name="sds", params=params)
    assert ks.params["schedule"] == "split_row" and "fold_block_softdot" in ks.source
    s, t = torch.randn(6, 300) * 3, torch.randn(6, 300) * 3
    torch.testing.assert_close(_kernel_output(p, region, [s, t], params), module()(s, t), rtol=1e-4, atol=1e-4)
    held = {**STREAMED, "split": 3}
    assert generate_kernel(p, list(region.nodes), name="sdh", params=held).params["cached"]
    torch.testing.assert_close(_kernel_output(p, region, [s, t], held), module()(s, t), rtol=1e-4, atol=1e-4)


@needs_gxx
def test_kl_of_a_masked_teacher_matches_torch():
    """A masked (-inf) teacher logit has probability 0: torch's kl_div adds nothing there, nor does the fold."""
    p, region = _region(KL())
    s, t = torch.randn(6, 300) * 3, torch.randn(6, 300) * 3
    t[0, :7] = float("-inf")
    t[4, 100:] = float("-inf")
    torch.testing.assert_close(_kernel_output(p, region, [s, t]), KL()(s, t), rtol=1e-4, atol=1e-4)


@needs_gxx
def test_a_weight_that_needs_the_rows_statistics_per_element_keeps_its_second_pass():
    p, region = _region(ProductOfProbabilities())
    ks = generate_kernel(p, list(region.nodes), name="pp", params=STREAMED)
    assert "softdot" not in ks.source and ks.params["rounds"] == 2
    s, t = torch.randn(6, 300), torch.randn(6, 300)
    torch.testing.assert_close(_kernel_output(p, region, [s, t]), ProductOfProbabilities()(s, t),
                               rtol=1e-4, atol=1e-5)


def test_the_distillation_block_reads_its_30k_class_rows_once():
    """DistilBERT's KL over 2048 rows of 30522 classes (its terms summed, as kl_div's lowering writes
    them, through the rewrites the planner runs): one block streams each row once (the softmax of the
    teacher and the weighted sum share one state), no cluster, no spills for sm_90."""
    p, _ = kl_total((2048, 30522))
    for node in p.nodes.values():
        if node.op == "max_scalar":         # the clamp as kl_div's lowering writes it
            node.attrs["value"] = FLT_MIN
    p = rewrite_program(p, check=False).program
    [region] = plan_program(p).active
    ks = generate_kernel(p, list(region.nodes), name="kl", kind=region.kind)
    assert ks.params["schedule"] == "stream" and ks.params["cluster"] == 1 and ks.params["rounds"] == 1
    assert ks.source.count("fold_block_softdot(round1") == 1 and ks.source.count("fold_block_maxsumexp(round1") == 1
    compiled = compile_kernel(ks, arch="sm_90")
    assert compiled.spill_stores == 0 and compiled.stack_bytes == 0, compiled.summary()
