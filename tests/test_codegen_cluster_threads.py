"""The cluster-per-row schedule's threads per CTA (codegen/rowkernel.py `_schedule`, row_tuning.tune_variants).

DistilBERT's distillation KL terms (2048 rows of 30522, student and teacher, written per element)
run a cluster of 4 CTAs per row. With 1024 threads a CTA (40 registers each) one CTA fills an SM's 64K
registers and its loads wait while it reduces: 734 us on the H100 (the block's KL, when it still read
its rows twice). Rows that fill the SMs take CTAs of 256 threads, several per SM, one loading while
another reduces: 366 us (a thread past cluster_thread_floats re-reads its share from L2 each round).
The tuner times twice and half the CTAs and the threads a CTA beside it. (The block itself, a sum of
the terms, now streams each row once: tests/test_softmax_dot.py.)

CPU: at the real size (no tensors), the default and its variants compile without spills, and the
default fits several CTAs per SM by ptxas's register count where 1024 threads fit one (the CPU
emulator runs no clusters, so the numbers are checked on the GPU only).
GPU (`-m gpu`, tests/gpu/test_gpu_cluster_threads.py): the variants against torch over 5 draws at
the block's size and on ragged rows.
"""

import pytest

from agent_core.codegen import generate_kernel
from agent_core.codegen.row_tuning import tune_variants
from agent_core.compiler import compile_kernel
from tests.programs import kl_terms

SM_REGISTERS = 65536


@pytest.fixture(scope="module")
def kl_region():
    """The block's KL terms at its real size: (program, region nodes)."""
    return kl_terms((2048, 30522))


def _ctas_per_sm(ks) -> int:
    c = compile_kernel(ks, arch="sm_90")
    assert c.spill_stores == 0 and c.registers, c.summary()
    return SM_REGISTERS // (c.registers * ks.block[0])


def test_rows_that_fill_the_sms_take_ctas_of_256_threads_several_per_sm(kl_region):
    p, nodes = kl_region
    ks = generate_kernel(p, nodes, name="kl")
    n = ks.params["cluster"]
    assert ks.params["schedule"] == "cluster" and n > 1 and ks.block == (256, 1, 1)
    variants = [{k: v for k, v in o.items() if k != "sm_count"} for o in tune_variants(ks.params)]
    assert variants[:2] == [{"cluster": 2 * n, "threads_per_row": 256}, {"cluster": n, "threads_per_row": 512}]
    assert {"cluster": 1} in variants
    full = generate_kernel(p, nodes, name="kl", params={"threads_per_row": 1024})
    assert full.params["schedule"] == "cluster" and full.params["cluster"] == n and full.block == (1024, 1, 1)
    assert _ctas_per_sm(full) == 1 and _ctas_per_sm(ks) >= 2
    for v in variants[:2]:
        assert _ctas_per_sm(generate_kernel(p, nodes, name="kl", params=v)) >= 2
    # rows of 30522 take scalar loads: the stream also with 1024 threads of 8 loads in flight each
    assert ks.params["vector_width"] == 1 and variants[-1] == {"cluster": 1, "threads_per_row": 1024, "unroll": 8}
    stream = generate_kernel(p, nodes, name="kl", params=variants[-1])
    # (8 loads in flight over its two inputs: 4 each)
    assert stream.params["schedule"] == "stream" and stream.block == (1024, 1, 1) and stream.params["unroll"] == 4
    assert _ctas_per_sm(stream) == 1


def test_a_tuner_threads_per_row_outside_the_cluster_rule_is_refused():
    from agent_core.codegen.kernel import CodegenError
    p, nodes = kl_terms((2048, 30522))      # the block's terms at its size: a cluster of 4 CTAs per row
    assert generate_kernel(p, nodes, name="kl").params["schedule"] == "cluster"
    for bad in (64, 384, 2048):
        with pytest.raises(CodegenError, match="threads_per_row of a cluster row"):
            generate_kernel(p, nodes, name="kl", params={"threads_per_row": bad})
