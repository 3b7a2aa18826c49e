"""On the GPU: the agent (`python3 -m agent_core.cli optimize` as a subprocess) on small attention
programs (causal over a chunked qkv projection, a padding mask, GQA): the attention region holds the
views of q, k and v and runs as our fused attention kernel, or falls back with its reason shown; the
whole program verifies; the precision form the region keeps is named in its outcome and in a
`precision` event. The outcomes are printed (-s).

PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_attention_agent_gpu.py -s
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SDPA = "scaled_dot_product_attention"
FORMS = ("3xtf32", "fp32")

HEADER = '''
import torch, torch.nn as nn, torch.nn.functional as F
B, T, C, H = 2, 300, 256, 4
'''

PROGRAMS = {
    "causal": HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))
def get_inputs(): return [torch.randn(B, T, C)]
def get_init_inputs(): return []
''',
    "padding": HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
    def forward(self, x, keep):
        q, k, v = (f(x).view(B, T, H, C // H).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.view(B, 1, 1, T))
        return self.o(y.transpose(1, 2).reshape(B, T, C))
def get_inputs():
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[0, 250:] = False
    keep[1, 100:] = False
    return [torch.randn(B, T, C), keep]
def get_init_inputs(): return []
''',
    "gqa": HEADER + '''
D = 64
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(C, 4 * D), nn.Linear(C, 4 * D), nn.Linear(4 * D, C)
    def forward(self, x):
        q = self.q(x).view(B, T, 2, 2, D).permute(0, 2, 3, 1, 4)
        k, v = self.kv(x).view(B, T, 2, 2, 1, D).unbind(dim=2)
        k, v = (t.permute(0, 2, 3, 1, 4).expand(B, 2, 2, T, D) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.o(y.permute(0, 3, 1, 2, 4).reshape(B, T, 4 * D))
def get_inputs(): return [torch.randn(B, T, C)]
def get_init_inputs(): return []
''',
}


def _optimize(tmp_path, name):
    src = tmp_path / f"{name}.py"
    src.write_text(textwrap.dedent(PROGRAMS[name]))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    p = subprocess.run([sys.executable, "-m", "agent_core.cli", "optimize", str(src), "-o", str(out),
                        "--no-baselines", "--tune-trials", "2", "--draws", "3", "--trials", "5"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    profile = json.loads((out / "profile.json").read_text())
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return p.stdout, profile, events


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_agent_keeps_our_attention_kernel_or_says_why(name, tmp_path):
    stdout, profile, events = _optimize(tmp_path, name)
    e2e = profile["end_to_end"]
    assert e2e["correct"], e2e["verify"]
    proposed = [e for e in events if e["event"] == "region-proposed" and e["kind"] == "attention"]
    assert len(proposed) == 1, [(e["region"], e["kind"]) for e in events if e["event"] == "region-proposed"]
    region = proposed[0]
    # q, k and v's views are inside the region: they cost no copy kernel of their own
    assert len(region["schedule"]["views_read_in_place"]) >= 6 and "in place" in region["reason"], region
    (outcome,) = [o for o in profile["regions"] if o["region"] == region["region"]]
    codegen = [e for e in events if e["event"] == "codegen" and e.get("region") == region["region"]]
    assert codegen and codegen[0]["kind"] == "attention", codegen
    print(f"{name}: {outcome['status']}: {outcome['reason']}")
    if outcome["status"] == "fused":
        kept = [e for e in events if e["event"] == "precision" and e.get("op") == SDPA]
        assert kept and kept[-1]["chosen"] in FORMS, kept
        assert f"attention form {kept[-1]['chosen']}" in outcome["reason"], outcome["reason"]
        assert outcome["params"].get("form") == kept[-1]["chosen"]
    else:
        # a fallback names its reason: verification (both forms tried), or not faster than torch
        assert outcome["reason"] and ("attention form" in outcome["reason"] or "verification" in outcome["reason"]), \
            outcome
