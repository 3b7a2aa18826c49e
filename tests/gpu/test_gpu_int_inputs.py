"""On the GPU: kernels with int64, int32, uint8, int8 and bool operands match torch exactly for integer
and bool outputs and at atol = rtol = 1e-6 for float32 outputs, on values that expose a lossy
conversion (int64 above 2^24 and 2^40, -100 labels, wrapping bytes).

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_int_inputs.py"""
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.reference import parameter_tensors, run_reference
from agent_core.runtime.launch import load_kernel
from tests import int_programs as IP
from tests.programs import fused

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def check(p, ids, name, seeds=(0, 1, 2)):
    """Generate, launch on the GPU and compare every output with the CPU reference."""
    ks = generate_kernel(p, ids, name=name)
    k = load_kernel(ks, p)
    params = parameter_tensors(p, "cpu")
    for seed in seeds:
        ins = IP.draw(p, seed)
        want = run_reference(p, {p.values[v].name: t for v, t in ins.items()}, device="cpu", keep=True)
        args = [{**params, **ins}[v].cuda() for v in ks.inputs]
        got = k(args)
        for v, g in zip(ks.outputs, got):
            w, g = want[v], g.cpu()
            what = f"{p.values[v].name} (seed {seed})"
            assert g.dtype == w.dtype, (what, g.dtype, w.dtype)
            if w.dtype.is_floating_point:
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6, equal_nan=True, msg=what)
            else:
                assert torch.equal(g, w), (what, (g != w).sum().item())
    return ks


@pytest.mark.parametrize("dtype", IP.DTYPES)
def test_every_integer_op(dtype):
    p, ids = IP.every_int_op(dtype)
    check(p, ids, f"int_ops_{dtype}")


def test_cross_entropy_labels_where_mask():
    p, ids = IP.cross_entropy_mask()
    check(p, ids, "ce_mask")


@pytest.mark.parametrize("dtype", IP.DTYPES)
@pytest.mark.parametrize("shape", [(8, 1000), (3, 7), (1, 4097)])
def test_mask_multiply(dtype, shape):
    p, ids = IP.mask_multiply(dtype, shape)
    check(p, ids, "mask_mul")


@pytest.mark.parametrize("case", sorted(IP.ROW_CASES))
def test_row_reduction_case(case):
    p, ids = IP.ROW_CASES[case]()
    check(p, ids, f"row_{case}")


def test_masked_mean_whole_program_through_build_region():
    """Each planned group of the masked mean runs as a kept kernel through the runtime (verified on
    5 draws by build_region) and the count is exact int64."""
    p, groups = IP.masked_mean("int64")
    for name, ids in groups.items():
        fused(p, ids, f"masked_mean_{name}")
