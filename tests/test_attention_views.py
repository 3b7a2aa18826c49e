"""The views that shape an attention's q, k, v and mask are read in place by our fused attention kernel:
the planner takes them into the attention region (planner/attention.py absorb_views), so they cost no
copy kernel. Programs are planned as `stitchcuda plan` plans them (tests/planned.py) from nn.Modules (a
linear -> view -> transpose per head, the chunk and the split of a fused qkv projection, a padding mask
broadcast over heads and queries, GQA's unbind and expand of kv heads, nn.MultiheadAttention's batch x
heads packed in one dim); the planned attention region generates in both forms, compiles through NVRTC
for sm_90 and, in the fp32 form, runs in the CPU emulator matching torch on the program's own values. A
view that something else also reads stays outside, and the attention region still generates."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agent_core.codegen import can_lower, generate_kernel
from agent_core.compiler import compile_kernel
from tests import planned

torch = pytest.importorskip("torch")
SDPA = "scaled_dot_product_attention"
GUARD = 256
VIEW_OPS = ("reshape", "view", "transpose", "permute", "slice", "select", "chunk", "split", "unbind", "expand",
            "unsqueeze")

HEADER = '''
import torch, torch.nn as nn, torch.nn.functional as F
B, T, C, H = 2, 37, 64, 2
'''

PER_HEAD = HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(C, C) for _ in range(4))
    def forward(self, x):
        q = self.q(x).view(B, T, H, C // H).transpose(1, 2)
        k = self.k(x).view(B, T, H, C // H).transpose(1, 2)
        v = self.v(x).view(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.o(y.transpose(1, 2).reshape(B, T, C))
def get_inputs(): return [torch.randn(B, T, C)]
def get_init_inputs(): return []
'''

CHUNKED = HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))
def get_inputs(): return [torch.randn(B, T, C)]
def get_init_inputs(): return []
'''

# split of the fused projection, heads by permute, and a [B, T] padding mask viewed as [B, 1, 1, T]
SPLIT_MASKED = HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
    def forward(self, x, keep):
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.reshape(B, T, H, C // H).permute(0, 2, 1, 3) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.view(B, 1, 1, T))
        return self.o(y.permute(0, 2, 1, 3).reshape(B, T, C))
def get_inputs():
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[:, T - 9:] = False
    return [torch.randn(B, T, C), keep]
def get_init_inputs(): return []
'''

# GQA: 4 query heads over 2 kv heads, as [B, kv heads, group, T, D]; k and v expanded over the group
GQA = HEADER + '''
D = 32
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
'''

# nn.MultiheadAttention packs batch and heads into one dim of [T, B * heads, D] over its in-projection's
# output after a transpose: read in place with that dim split back into B x heads
MHA = HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(C, H)
    def forward(self, x):
        y, _ = self.attn(x, x, x)
        return y
def get_inputs(): return [torch.randn(T, B, C)]
def get_init_inputs(): return []
'''

# k's transposed view is also summed elsewhere: it keeps its own region, the attention reads its copy
SHARED = HEADER + '''
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(C, C) for _ in range(3))
    def forward(self, x):
        q = self.q(x).view(B, T, H, C // H).transpose(1, 2)
        k = self.k(x).view(B, T, H, C // H).transpose(1, 2)
        v = self.v(x).view(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return y.sum(dim=-1) + k.sum(dim=-1)
def get_inputs(): return [torch.randn(B, T, C)]
def get_init_inputs(): return []
'''


def _plan(tmp_path: Path, src: str):
    """(the planned program, the plan's JSON) of `stitchcuda plan --no-check` on src (tests/planned.py)."""
    f = tmp_path / "model.py"
    f.write_text(src)
    as_dict, prog = planned.plan(f, small=False, check=False)
    return prog, as_dict


def _attention_region(prog):
    (node,) = [n for n in prog.nodes.values() if n.op == SDPA]
    (r,) = [r for r in prog.regions if node.id in r.nodes]
    return node, r


def _feeding_views(prog, node):
    """Every view node between the attention and the nearest non-view producers of its inputs."""
    found, todo = [], [v for v in node.inputs if v]
    while todo:
        p = prog.values[todo.pop()].producer
        if p is not None and prog.nodes[p].op in VIEW_OPS and p not in found:
            found.append(p)
            todo += [v for v in prog.nodes[p].inputs if v]
    return found


def _emulate(prog, r, inputs):
    """The attention region's fp32 kernel in the CPU emulator on the program's own values, and what
    torch computes for the region's output."""
    from agent_core.reference import run_reference
    from agent_core.writer.emulate import CpuExecutor
    from agent_core.writer.executors import guarded, payload
    env = run_reference(prog, inputs, keep=True)
    ks = generate_kernel(prog, r.nodes, name="att_views", kind=r.kind, params={"form": "fp32"})
    ins = [env[v].contiguous().numpy() for v in ks.inputs]
    out = prog.values[ks.outputs[0]]
    bufs = [guarded(a, GUARD) for a in ins] + [guarded(np.zeros(out.shape, np.float32), GUARD)]
    res = CpuExecutor().run(ks, [bufs], guard=GUARD)
    got = torch.from_numpy(payload(res[0][-1], GUARD, np.float32, tuple(out.shape)).copy())
    return got, env[ks.outputs[0]]


def _inputs(src: str):
    ns: dict = {}
    exec(compile(src, "model", "exec"), ns)
    torch.manual_seed(0)
    return ns["get_inputs"]()


@pytest.mark.parametrize("src", [PER_HEAD, CHUNKED, SPLIT_MASKED, GQA, MHA],
                         ids=["per_head", "chunked", "split_masked", "gqa", "multihead_attention"])
def test_views_before_attention_are_read_in_place_by_its_kernel(src, tmp_path):
    prog, plan = _plan(tmp_path, src)
    node, r = _attention_region(prog)
    views = _feeding_views(prog, node)
    assert len(views) >= 6, views            # a reshape / view and a transpose / permute for each of q, k, v
    assert set(views) <= set(r.nodes), (r.nodes, views)
    assert r.kind == "attention" and r.schedule["runs"] == "kernel", (r.kind, r.reason)
    assert set(r.schedule["views_read_in_place"]) == set(views)
    assert "in place through" in r.reason and "no copy kernel" in r.reason, r.reason
    # nothing between the projection and the attention runs as a kernel of its own
    for other in prog.regions:
        if other is not r and set(other.nodes) & set(views):
            raise AssertionError(f"{other.id} ({other.kind}) holds a view the attention reads: {other.nodes}")
    assert can_lower(prog, r.nodes, r.kind) is None
    for form in ("fp32", "3xtf32"):
        ks = generate_kernel(prog, r.nodes, name=f"att_views_{form}", kind=r.kind, params={"form": form})
        assert ks.kind == "attention" and len(ks.inputs) <= 4, ks.inputs   # the projections' outputs (+ mask)
        assert compile_kernel(ks, arch="sm_90").spill_stores == 0
    got, ref = _emulate(prog, r, _inputs(src))
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), float((got - ref).abs().max())


def test_the_fused_projections_output_is_the_only_tensor_read(tmp_path):
    prog, _ = _plan(tmp_path, CHUNKED)
    node, r = _attention_region(prog)
    ks = generate_kernel(prog, r.nodes, name="att_chunked", kind=r.kind, params={"form": "fp32"})
    (src,) = ks.inputs            # q, k and v are three strided reads of the one qkv tensor
    assert prog.values[src].shape[-1] == 3 * 64 and prog.nodes[prog.values[src].producer].op == "linear"
    assert node.attrs.get("is_causal")


def test_a_view_something_else_reads_stays_outside_and_the_attention_still_generates(tmp_path):
    prog, _ = _plan(tmp_path, SHARED)
    node, r = _attention_region(prog)
    k_view = prog.values[node.inputs[1]].producer
    assert prog.nodes[k_view].op == "transpose" and k_view not in r.nodes, r.nodes
    q_view = prog.values[node.inputs[0]].producer
    assert q_view in r.nodes            # q's own views are still read in place
    assert r.kind == "attention" and r.schedule["runs"] == "kernel", r.reason
    assert can_lower(prog, r.nodes, r.kind) is None
    got, ref = _emulate(prog, r, _inputs(SHARED))
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), float((got - ref).abs().max())


def _offsets(view):
    """Every element's offset of a plain view, row-major over its shape."""
    idx = np.indices(view.shape).reshape(len(view.shape), -1)
    return view.offset + sum(i * s for i, s in zip(idx, view.strides))


@pytest.mark.parametrize("bottom_shape,bottom_strides,top_shape,top_strides,top_offset,expect", [
    # MHA: [T, B, 3E] as [3, T, B, E] (bottom), its q read as [B * heads, T, D] (top) split B x heads
    ((5, 2, 8), (48, 24, 1), (2, 2, 5, 4), (8, 4, 16, 1), 0, True),
    ((5, 2, 8), (48, 24, 1), (2, 2, 4, 4), (8, 4, 16, 1), 16, True),      # from the second row on
    ((5, 2, 8), (48, 24, 1), (2, 2, 5, 4), (8, 4, 16, 1), 4, False),      # heads from 4 carry past 8
    ((4, 6), (1, 4), (3, 4, 2), (2, 6, 1), 0, True),                      # a transposed bottom
    ((2, 3), (3, 1), (4,), (1,), 0, False),                               # 4 steps of 1 carry over 3
    ((2, 4), (4, 1), (2, 2), (1, 2), 1, False),                           # offset 1 + 1 + 2 carries
])
def test_compose_folds_a_view_of_a_view_into_one_or_says_it_cannot(bottom_shape, bottom_strides, top_shape,
                                                                    top_strides, top_offset, expect):
    from agent_core.codegen import views as V
    from agent_core.codegen.attention_reads import compose
    bottom = V.View.create(bottom_shape, bottom_strides, 3)
    top = V.View.create(top_shape, top_strides, top_offset)
    one = compose(bottom, top)
    assert (one is not None) == expect
    if one is not None:         # the top's row-major index of the bottom, read through the bottom's strides
        flat = _offsets(top)
        coords = np.unravel_index(flat, bottom_shape)
        want = 3 + sum(c * s for c, s in zip(coords, bottom_strides))
        assert one.shape == tuple(top_shape) and np.array_equal(_offsets(one), want)


def test_split_cuts_a_packed_dim_where_its_walk_changes_dims():
    from agent_core.codegen.attention_reads import split
    assert split(8, 32, (16384, 2, 128)) == [2, 4]          # B * heads over [T, B, E]: B x heads
    assert split(6, 1, (2, 3)) == [2, 3]
    assert split(4, 0, (2, 3)) == [4]                        # an expanded dim: one piece, stride 0
    assert split(3, 1, (2, 2)) is None                       # 3 steps of 1 through dims of 2
