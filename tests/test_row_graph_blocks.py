"""The row graph (rowgraph.py, rendered by rowkernel.py) writes every row region of the blocks whose
rows need the most of it, with torch's results: the regions the per-pattern templates wrote until
they were deleted (rowreduce.py: one reduction; class_loss.py: log_softmax -> nll_loss; scan.py).

Each block is planned at its small size as `stitchcuda plan` plans it; every row region is generated as optimize
generates it, compiled with NVRTC for sm_90 and run on the CPU emulator with the region's inputs
from the block's reference run: its outputs equal torch's at 1e-5.
"""
from __future__ import annotations

import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.reference import draw, run_reference
from tests import planned
from tests.test_codegen_column_tiles import _emulate_region, needs_gxx

# blocks whose row regions need what the row graph learnt last: operands broadcast over some rows,
# a mask computed per element, (sample, group) rows, a prologue of embeddings of different sizes; the
# class losses: masked labels reshaped in the prologue, label smoothing, classes on dim 1 of [N, C, H, W];
# a standardisation over one axis computed from its statistics in the prologue of a softmax over the other
BLOCKS = ["embedding_position_layernorm_bert", "masked_softmax_bert_base", "masked_mean_pool_normalize_minilm",
          "groupnorm_silu_sdxl_unet", "groupnorm_temb_silu_sd15_resnet", "layernorm_residual_bert_base",
          "rmsnorm_residual_llama7b", "alibi_causal_softmax_bloom", "squeeze_excitation_efficientnet_b0",
          "cross_entropy_llama2_32k", "cross_entropy_llama3_128k_smoothing", "log_softmax_nll_deeplab_cityscapes",
          "standardize_softmax_dino_teacher"]


@needs_gxx
@pytest.mark.parametrize("block", BLOCKS)
def test_every_row_region_of_the_block_equals_torch(block):
    from types import SimpleNamespace

    _, p = planned.plan(planned.block(block), small=True)
    regions = [r for r in p.regions if r.schedule.get("runs") in ("kernel", "library+kernel")
               and r.kind in ("reduction", "normalization", "row_reduction", "class_loss", "scan")]
    assert regions, "the block has no row region: pick another"
    g = torch.Generator().manual_seed(0)
    # integers follow the block's own draw (labels over the vocabulary, a 0/1 mask)
    ins = [torch.randn(p.values[v].shape, generator=g) if p.values[v].dtype == "float32" else
           draw(p.values[v].shape, p.values[v].dtype, p.values[v].init, g) for v in p.inputs]
    env = run_reference(p, ins, keep=True)
    for r in regions:
        ks = generate_kernel(p, r.nodes, name=f"graph_{r.id}", kind=r.kind)
        assert ks.kind == "row_reduction", (r.id, ks.kind)
        compile_kernel(ks, arch="sm_90")
        nodes = [n for n in r.nodes if n not in ks.library_nodes]
        _, outs = _emulate_region(p, SimpleNamespace(nodes=nodes, id=r.id), env, ks=ks)
        for v, got in outs.items():
            torch.testing.assert_close(got, env[v].float(), atol=1e-5, rtol=1e-5,
                                       msg=lambda m, v=v: f"{r.id} {p.values[v].name}: {m}")


@needs_gxx
def test_a_prologue_of_embeddings_of_different_sizes_feeds_one_row_kernel():
    """BERT's embeddings: word [B, L, D] and position [1, L, D] gathered in the prologue (each read
    at its own index), added, then layer_norm over D, in one row-graph kernel equal to torch."""
    import numpy as np

    from agent_core.ir import Program
    from types import SimpleNamespace
    p = Program("embeddings")
    ids = p.add_input("ids", (4, 6), "int64")
    pos = p.add_input("pos", (1, 6), "int64")
    rng = np.random.default_rng(0)
    word = p.add_parameter("word", rng.standard_normal((10, 8)).astype(np.float32))
    table = p.add_parameter("table", rng.standard_normal((6, 8)).astype(np.float32))
    e1 = p.add_node("embedding", [ids.id, word.id])
    e2 = p.add_node("embedding", [pos.id, table.id])
    s = p.add_node("add", [e1.outputs[0], e2.outputs[0]])
    w = p.add_parameter("w", np.linspace(0.5, 1.5, 8, dtype=np.float32))
    ln = p.add_node("layer_norm", [s.outputs[0], w.id, None], {"normalized_shape": [8], "eps": 1e-12})
    p.mark_output(ln.outputs[0])
    nodes = [e1.id, e2.id, s.id, ln.id]
    ks = generate_kernel(p, nodes, name="embeddings")
    compile_kernel(ks, arch="sm_90")
    g = torch.Generator().manual_seed(0)
    ins = [torch.randint(0, 10, (4, 6), generator=g), torch.arange(6).view(1, 6)]
    env = run_reference(p, ins, keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=nodes, id="r"), env, ks=ks)
    torch.testing.assert_close(outs[ln.outputs[0]], env[ln.outputs[0]], atol=1e-5, rtol=1e-5)


@needs_gxx
def test_a_batch_norm_after_a_cat_before_a_global_pool_is_one_kernel():
    """DenseNet's head: cat -> batch_norm -> relu -> global average pool. The row graph reads the cat
    through its view and normalizes per element: one kernel equal to torch."""
    import numpy as np

    from agent_core.ir import Program
    from types import SimpleNamespace
    p = Program("densenet_head")
    a = p.add_input("a", (2, 3, 4, 4))
    b = p.add_input("b", (2, 5, 4, 4))
    cat = p.add_node("cat", [a.id, b.id], {"dim": 1})
    rng = np.random.default_rng(0)
    bn_params = [p.add_parameter(n, rng.uniform(0.5, 1.5, 8).astype(np.float32)).id
                 for n in ("mean", "var", "weight", "bias")]
    bn = p.add_node("batch_norm", [cat.outputs[0], *bn_params], {"eps": 1e-5})
    relu = p.add_node("relu", [bn.outputs[0]])
    pool = p.add_node("adaptive_avg_pool2d", [relu.outputs[0]], {"output_size": [1, 1]})
    p.mark_output(pool.outputs[0])
    nodes = [cat.id, bn.id, relu.id, pool.id]
    ks = generate_kernel(p, nodes, name="head")
    assert ks.kind == "row_reduction" and "reductions (adaptive_avg_pool2d)" in ks.source
    compile_kernel(ks, arch="sm_90")
    g = torch.Generator().manual_seed(0)
    env = run_reference(p, [torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 5, 4, 4, generator=g)], keep=True)
    _, outs = _emulate_region(p, SimpleNamespace(nodes=nodes, id="r"), env, ks=ks)
    torch.testing.assert_close(outs[pool.outputs[0]], env[pool.outputs[0]], atol=1e-5, rtol=1e-5)
