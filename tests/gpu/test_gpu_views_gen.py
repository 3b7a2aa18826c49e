"""On the GPU: layout-graph kernels (agent_core/codegen/layout_graph.py) match torch at atol = rtol =
1e-6 on random inputs, float4 and scalar, for RoPE (slice / neg / cat / mul / add), SwiGLU (chunk /
silu / mul), a class-token cat, stack, pad + flip, two rolls, shifted slices, split pieces joined back,
interleaved strided slices, repeat, embedding + position, gather and index_select; several shapes each, odd extents among them (tests/
test_codegen_views_gen.py checks the same kernels' index arithmetic on the CPU).

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_views_gen.py"""
import pytest
import torch

from agent_core.reference import run_reference
from agent_core.runtime import build_region
from tests.test_codegen_views_gen import (class_token, embedded, gathered, interleaved, padded, repeated, rolled,
                                          rope, selected, shifted, split_back, stacked, swiglu)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [
    ("rope-llama", rope, ((2, 32, 256, 128),)),
    ("rope-odd", rope, ((3, 5, 77, 10),)),
    ("rope-129", rope, ((2, 8, 129, 32),)),
    ("swiglu", swiglu, ((512, 2 * 1376), "silu")),
    ("swiglu-odd", swiglu, ((37, 2 * 333), "silu")),
    ("geglu", swiglu, ((64, 2 * 640), "gelu")),
    ("class-token", class_token, (8, 196, 768)),
    ("class-token-odd", class_token, (3, 49, 37)),
    ("stack", stacked, ((256, 512),)),
    ("stack-odd", stacked, ((33, 65),)),
    ("pad-flip", padded, ((129, 77),)),
    ("roll", rolled, ((64, 1001),)),
    ("shifted-cols", shifted, ((16, 4097),)),
    ("shifted-rows", shifted, ((2049, 256), 0)),
    ("split-back", split_back, ((300, 515),)),
    ("interleave", interleaved, ((128, 1024),)),
    ("interleave-odd", interleaved, ((7, 34),)),
    ("repeat", repeated, ((128, 768),)),
    ("embedding-bert", embedded, (8, 512, 30522, 768)),
    ("embedding-odd", embedded, (3, 7, 101, 13)),
    ("gather", gathered, ((512, 1000), 17)),
    ("index-select", selected, ((4099, 33), 1000)),
]


@pytest.mark.parametrize("vector,unroll", [(True, 1), (False, 1), (True, 2), (False, 2)],
                         ids=["float4", "scalar", "float4-unroll2", "scalar-unroll2"])
@pytest.mark.parametrize("label,builder,args", CASES, ids=[c[0] for c in CASES])
def test_layout_graph_matches_torch(label, builder, args, vector, unroll):
    """unroll 2: two grid-stride steps at a time, then the steps left one at a time."""
    p = builder(*args)
    ids = list(p.nodes)
    r = build_region(p, ids, name=label.replace("-", "_"),
                     params={"vector": vector, **({"unroll": unroll} if unroll > 1 else {})})
    assert r.fused, r.fallback_reason
    assert r.kernel.params["graph"], r.kernel.schedule
    assert r.kernel.params.get("unroll", 1) == unroll or r.kernel.params.get("staged"), r.kernel.params
    assert r.verify.ok and r.verify.draws == 5, r.verify
    for seed in range(3):
        g = torch.Generator(device="cuda").manual_seed(seed)
        ins = {}
        for v in p.inputs:
            val = p.values[v]
            ins[v] = torch.randint(val.init["low"], val.init["high"], val.shape, device="cuda", generator=g) \
                if val.dtype == "int64" else torch.randn(val.shape, device="cuda", generator=g)
        want = run_reference(p, [ins[v] for v in p.inputs], keep=True)
        got = r([ins[v] for v in r.inputs])
        for vid, t in zip(r.outputs, got):
            torch.testing.assert_close(t.reshape(want[vid].shape), want[vid], atol=1e-6, rtol=1e-6)
