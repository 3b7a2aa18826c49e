"""Written-out attention becomes one scaled_dot_product_attention node (rewrites/raise_attention.py).

Each spelling is a small nn.Module imported the way a user's model is (the importer, then optimize's
rewrites with their numerical check); the rewritten program must hold one SDPA node where the module
had one attention, and compute what the module computes on fresh random inputs. The negative cases
(the scores read twice, a relu between two weights' products, a softmax over another dim, float64) stay
as written; ReLU attention becomes one node with score relu;
a constant mask that is not causal stays a mask. The CLI tests run `rewrite` and `plan` as a user does.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agent_core.importers import import_nn_module
from agent_core.project_file import load_program
from agent_core.reference import run_reference
from agent_core.rewrites import rewrite_program

SDPA = "scaled_dot_product_attention"
ROOT = Path(__file__).resolve().parent.parent
LEVEL3 = ROOT / "kernelbench" / "KernelBench" / "level3"
B, H, T, D = 2, 3, 10, 16


def _qkv(L=T, S=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, H, S, D, generator=g),
            torch.randn(B, H, S, D, generator=g))


class MinGPT(nn.Module):
    """karpathy's minGPT: scale after the product, masked_fill from a tril buffer, eval dropout."""
    def __init__(self, max_len=16):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))
        self.drop = nn.Dropout(0.1)

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return self.drop(F.softmax(att, dim=-1)) @ v


class PreScaled(nn.Module):
    """q scaled before the product, no mask."""
    def forward(self, q, k, v):
        return torch.softmax((q * q.size(-1) ** -0.5) @ k.transpose(-2, -1), dim=-1) @ v


class DividedAdditive(nn.Module):
    """A division by sqrt(d) and an additive float mask given as an input."""
    def forward(self, q, k, v, bias):
        return F.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias, dim=-1) @ v


class Bmm(nn.Module):
    """torch.bmm over (batch * heads) and a tril made in forward."""
    def forward(self, q, k, v):
        q, k, v = (t.reshape(-1, t.size(-2), t.size(-1)) for t in (q, k, v))
        att = torch.bmm(q, k.transpose(1, 2)) * 0.25
        keep = torch.tril(torch.ones(q.size(1), k.size(1)))
        return torch.bmm(att.masked_fill(keep == 0, float("-inf")).softmax(-1), v)


class Einsum(nn.Module):
    """einsum products and a causal mask made as index arithmetic."""
    def forward(self, q, k, v):
        L, S = q.size(-2), k.size(-2)
        att = torch.einsum("bhld,bhsd->bhls", q, k) / math.sqrt(q.size(-1))
        later = torch.arange(S)[None, :] > torch.arange(L)[:, None]
        return torch.einsum("bhls,bhsd->bhld", att.masked_fill(later, float("-inf")).softmax(-1), v)


class TriuBias(nn.Module):
    """An additive causal bias: -inf above the diagonal (triu), 0 elsewhere."""
    def forward(self, q, k, v):
        bias = torch.full((q.size(-2), k.size(-2)), float("-inf")).triu(1)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.3 + bias, dim=-1) @ v


class Padding(nn.Module):
    """A padding mask from a bool input: a row whose keys are all padding gives NaN as written."""
    def forward(self, q, k, v, keep):
        att = (q @ k.transpose(-2, -1)) / 4.0
        att = torch.where(keep[:, None, None, :], att, float("-inf"))
        return att.softmax(-1) @ v


class MHA(nn.Module):
    def __init__(self, need_weights=True, **kw):
        super().__init__()
        self.attn, self.need_weights = nn.MultiheadAttention(64, 4, **kw), need_weights

    def forward(self, x):
        return self.attn(x, x, x, need_weights=self.need_weights)[0]


class MHAMasked(nn.Module):
    """nn.MultiheadAttention with a float attn_mask: torch writes it as baddbmm(mask, q, k^T)."""
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4)

    def forward(self, x, mask):
        return self.attn(x, x, x, attn_mask=mask)[0]


def _rewrite(module, args):
    program = import_nn_module(module, args)
    result = rewrite_program(program)
    return program, result


def _ops(program, op):
    return [n for n in program.nodes.values() if n.op == op]


def _matches_module(module, args, program, nan_rows=False):
    names = [program.values[v].name for v in program.inputs]
    got = run_reference(program, dict(zip(names, args)))
    (out,) = got.values()
    with torch.no_grad():
        want = module.eval()(*args)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, equal_nan=nan_rows)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 100))


CASES = {   # name: (module, inputs for a seed, is_causal expected, attn_mask input expected)
    "mingpt_tril_buffer": (MinGPT(), lambda s: _qkv(seed=s), True, False),
    "prescaled_q": (PreScaled(), lambda s: _qkv(seed=s), False, False),
    "divided_additive_input": (DividedAdditive(), lambda s: _qkv(seed=s) + (_rand(T, T, seed=s),), False, True),
    "bmm_tril_in_forward": (Bmm(), lambda s: _qkv(seed=s), True, False),
    "einsum_index_arithmetic": (Einsum(), lambda s: _qkv(seed=s), True, False),
    "einsum_cross_lengths": (Einsum(), lambda s: _qkv(L=6, S=12, seed=s), True, False),   # top-left causal
    "triu_additive_bias": (TriuBias(), lambda s: _qkv(seed=s), True, False),
    "multihead_attention": (MHA(), lambda s: (_rand(T, B, 64, seed=s),), False, False),
    "multihead_attention_mask": (MHAMasked(), lambda s: (_rand(T, B, 64, seed=s), _rand(T, T, seed=s + 1)),
                                 False, True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_written_out_spelling_becomes_one_attention_node(name):
    module, make, causal, masked = CASES[name]
    before, result = _rewrite(module, make(0))
    assert _ops(before, "softmax"), f"{name} should import written out"
    prog = result.program
    (node,) = _ops(prog, SDPA)
    left = [n.op for n in prog.nodes.values() if n.op in ("softmax", "matmul", "bmm", "einsum", "baddbmm")]
    assert not left, left
    assert bool(node.attrs["is_causal"]) is causal
    assert (len(node.inputs) > 3 and node.inputs[3] is not None) is masked
    assert result.rules_fired.get("raise_attention") == 1
    _matches_module(module, make(1), prog)


def test_a_padding_mask_that_hides_whole_rows_gives_nan_there_as_written():
    module = Padding()
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[0] = False             # batch 0 has no real key: every row is NaN in the written-out form
    keep[1, 6:] = False
    args = _qkv() + (keep,)
    _, result = _rewrite(module, args)
    (node,) = _ops(result.program, SDPA)
    assert node.inputs[3] is not None and not node.attrs["is_causal"]
    _matches_module(module, args, result.program, nan_rows=True)
    with torch.no_grad():
        assert torch.isnan(module(*args)[0]).all() and not torch.isnan(module(*args)[1]).any()


def test_already_fused_multihead_attention_and_encoder_layer_keep_one_attention_node():
    for module in (MHA(need_weights=False, batch_first=True),
                   nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)):
        args = (torch.randn(B, T, 64),)
        _, result = _rewrite(module, args)
        assert len(_ops(result.program, SDPA)) == 1 and not _ops(result.program, "softmax")
        _matches_module(module, args, result.program)


# --- not attention, or not only attention -----------------------------------------------------------
class ScoresReturned(nn.Module):
    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
        return att @ v, att


class ReluMLP(nn.Module):
    """relu between two products with weights: the shape of ReLU attention, but an MLP."""
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.randn(D, 32) * 0.25), nn.Parameter(torch.randn(32, D) * 0.25)

    def forward(self, q, k, v):
        return F.relu(q @ self.w1) @ self.w2 + k.sum() + v.sum()


class SoftmaxOverQueries(nn.Module):
    def forward(self, q, k, v):
        return (q @ k.transpose(-2, -1) * 0.25).softmax(-2) @ v


class BandMask(nn.Module):
    """A constant mask that is not causal: keys at most 2 positions away."""
    def forward(self, q, k, v):
        T = q.size(-2)
        near = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs() <= 2
        return (q @ k.transpose(-2, -1) * 0.25).masked_fill(~near, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("module", [ScoresReturned(), ReluMLP(), SoftmaxOverQueries()],
                         ids=["scores_used_twice", "relu_between_weights", "softmax_over_queries"])
def test_what_is_not_plain_attention_stays_written_out(module):
    before, result = _rewrite(module, _qkv())
    assert not _ops(result.program, SDPA)
    assert len(_ops(result.program, "matmul")) == len(_ops(before, "matmul")) == 2


class ReluAttention(nn.Module):
    """ReLU self-attention as KernelBench's level 3 writes it: relu instead of softmax, unnormalised
    (sigmoid attention likewise, with torch.sigmoid)."""
    def __init__(self, causal: bool, score=F.relu):
        super().__init__()
        self.causal, self.score = causal, score
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return self.score(att) @ v


@pytest.mark.parametrize("causal,score", [(True, "relu"), (False, "relu"), (True, "sigmoid")],
                         ids=["relu-causal", "relu-unmasked", "sigmoid-causal"])
def test_relu_or_sigmoid_attention_becomes_one_attention_node_with_that_score(causal, score):
    module = ReluAttention(causal, getattr(torch, score))
    before, result = _rewrite(module, _qkv())
    assert _ops(before, score) and not _ops(before, SDPA)
    (node,) = _ops(result.program, SDPA)
    assert node.attrs["score"] == score and bool(node.attrs["is_causal"]) is causal
    assert not _ops(result.program, score) and not _ops(result.program, "matmul")
    _matches_module(module, _qkv(seed=1), result.program)


def test_float64_attention_is_not_raised():
    args = tuple(t.double() for t in _qkv())
    _, result = _rewrite(PreScaled().double(), args)
    assert not _ops(result.program, SDPA) and _ops(result.program, "softmax")


def test_a_constant_mask_that_is_not_causal_stays_a_mask():
    args = _qkv()
    _, result = _rewrite(BandMask(), args)
    (node,) = _ops(result.program, SDPA)
    assert not node.attrs["is_causal"] and node.inputs[3] is not None
    assert not _ops(result.program, "where")      # no row is hidden entirely: no NaN fix-up
    _matches_module(BandMask(), args, result.program)


# --- as a user runs it --------------------------------------------------------------------------------
KB_FILE = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n_embd, n_head, max_len):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.register_buffer("bias", torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len))
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)


def get_inputs():
    return [torch.rand(2, 12, 64)]


def get_init_inputs():
    return [64, 2, 16]
'''


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "agent_core.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def test_the_rewrite_command_raises_attention_in_a_kernelbench_file(tmp_path):
    src = tmp_path / "causal_block.py"
    src.write_text(KB_FILE)
    proc = _cli("rewrite", str(src), "-o", str(tmp_path / "out.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "raise_attention" in proc.stdout and "is_causal" in proc.stdout
    prog = load_program(tmp_path / "out.json")
    (node,) = _ops(prog, SDPA)
    assert node.attrs["is_causal"] and len([v for v in node.inputs if v]) == 3
    assert not _ops(prog, "softmax") and not _ops(prog, "where")


@pytest.mark.skipif(not LEVEL3.is_dir(), reason=f"{LEVEL3} is absent (KernelBench is not part of the repository)")
@pytest.mark.parametrize("stem", ["43_MinGPTCausalAttention", "44_MiniGPTBlock", "50_ReLUSelfAttention"])
def test_level3_causal_attention_plans_as_one_attention_region(stem, tmp_path):
    out = tmp_path / "planned.json"
    proc = _cli("plan", str(LEVEL3 / f"{stem}.py"), "--no-check", "--json", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    fired = [e for e in json.loads(proc.stdout)["rewrites"]["fired"] if e["rule"] == "raise_attention"]
    assert len(fired) == 1, proc.stdout[-2000:]
    prog = load_program(out)
    (node,) = _ops(prog, SDPA)
    assert node.attrs["is_causal"] and not _ops(prog, "softmax")
    assert node.attrs.get("score", "softmax") == ("relu" if "ReLU" in stem else "softmax")
    holding = [r for r in prog.regions if node.id in r.nodes]
    assert len(holding) == 1, [(r.id, r.kind, r.nodes) for r in prog.regions]
    assert not [n for n in holding[0].nodes if prog.nodes[n].op in ("matmul", "bmm")]
