"""On the GPU: argmax / argmin (int64 results), cumsum / cumprod and a lone nll_loss (int64 targets; a
row kernel that gathers one element per row, rowpick.py) match the reference on 5
random draws (atol = rtol = 1e-4), and the index results equal torch's exactly on crafted inputs:
repeated maxima and minima (the first index wins), NaNs (the first NaN wins), infinities and signed
zeros; ignored and out-of-range targets.

Run on the GPU machine: PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_gpu_indexed.py
(needs only torch, cupy, numpy, networkx and pytest)."""
import pytest
import torch
import torch.nn.functional as F

from tests.programs import arg_program, fused, nll_program, scan_program

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]



def torch_arg(op, x, dim, keepdim):
    return (torch.argmax if op == "argmax" else torch.argmin)(x, dim=dim, keepdim=keepdim)


# --- argmax / argmin ----------------------------------------------------------------------------
ARG_CASES = [
    ((64, 1000), 1, False), ((64, 1000), -1, True), ((9, 7), 0, False), ((40, 33), 0, True),
    ((6, 5, 7), -1, True), ((3, 5, 40), 1, False), ((4, 10, 3), 1, True), ((64, 100), None, False),
    ((3, 4, 5), None, True), ((5, 3000), -1, False), ((3, 17001), 1, False), ((7, 2000, 3), 1, False),
    ((33,), None, False), ((1,), 0, False), ((), None, False), ((1000, 4096), 1, False),
]


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape,dim,keepdim", ARG_CASES)
def test_arg_reductions(op, shape, dim, keepdim):
    p, nid = arg_program(op, shape, dim, keepdim)
    r = fused(p, [nid], f"{op}_r")
    x = torch.randn(shape, device="cuda")
    (got,) = r([x])
    assert got.dtype == torch.int64
    want = torch_arg(op, x, dim, keepdim)
    assert torch.equal(got.reshape(want.shape), want)


def crafted(shape, seed):
    """Few distinct values (many ties), some NaNs, infinities and signed zeros; a row of equal values,
    a row of NaNs and a row of -inf / +inf when there are rows to spare."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, shape, generator=g).float()
    u = torch.rand(shape, generator=g)
    x[u < 0.003] = float("nan")
    x[(u > 0.5) & (u < 0.505)] = float("inf")
    x[(u > 0.6) & (u < 0.605)] = -float("inf")
    x[(u > 0.7) & (x == 0)] = -0.0
    if x.dim() == 2 and x.shape[0] >= 4:
        x[0] = 1.0
        x[1] = float("nan")
        x[2] = -float("inf")
        x[3] = float("inf")
    return x


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape,dim", [
    ((64, 1000), 1), ((8, 3001), 1), ((6, 20000), -1), ((300, 5), 0), ((100, 40), 0), ((9, 7), 0),
    ((4, 10, 3), 1), ((50, 70), None), ((1000, 33), 1),
])
def test_ties_and_nans_match_torch_exactly(op, shape, dim):
    p, nid = arg_program(op, shape, dim)
    r = fused(p, [nid], f"{op}_ties")
    for seed in range(3):
        x = crafted(shape, seed)
        (got,) = r([x.cuda()])
        got = got.cpu().reshape(-1)
        want = torch_arg(op, x, dim, False).reshape(-1)   # torch on the CPU: the reference
        assert torch.equal(got, want), (seed, (got != want).nonzero()[:5].flatten().tolist())


# --- cumsum / cumprod ---------------------------------------------------------------------------
SCAN_CASES = [
    ((6, 1), 1), ((6, 33), 1), ((6, 1000), -1), ((64, 1000), 1), ((3, 5000), 1), ((2, 70001), -1),
    ((4, 1, 7), 1), ((4, 33, 5), 1), ((2, 1000, 3), 1), ((2, 5000, 3), 1), ((3, 40, 64), 1),
    ((1000, 40), 0), ((17,), 0), ((256, 4096), 1),
]


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("shape,dim", SCAN_CASES)
def test_scans(op, shape, dim):
    p, nid = scan_program(op, shape, dim)
    fused(p, [nid], f"{op}_r")


@pytest.mark.parametrize("shape,dim", [((4, 1000), 1), ((3, 5000), 1), ((2, 40, 64), 1)])
def test_scan_nan_and_zero_propagate(shape, dim):
    x = torch.randn(shape)
    x.select(dim, 5).fill_(float("nan"))
    p, nid = scan_program("cumsum", shape, dim)
    (got,) = fused(p, [nid], "cumsum_nan")([x.cuda()])
    assert torch.equal(torch.isnan(got.cpu()), torch.isnan(torch.cumsum(x, dim)))
    x = torch.rand(shape) + 0.5
    x.select(dim, 7).zero_()
    p, nid = scan_program("cumprod", shape, dim)
    (got,) = fused(p, [nid], "cumprod_zero")([x.cuda()])
    assert torch.allclose(got.cpu(), torch.cumprod(x, dim), atol=1e-4, rtol=1e-4)
    assert (got.cpu().narrow(dim, 7, shape[dim] - 7) == 0).all()


# --- nll_loss -----------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weight", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("shape", [(16, 10), (4, 5, 3, 2), (7,), (4096, 1000), (8, 21, 32, 32)],
                         ids=["NC", "NCd", "C", "big_NC", "segmentation"])
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_nll_loss(shape, reduction, weight, ignore_index):
    p, nid = nll_program(shape, reduction, weight, ignore_index)
    r = fused(p, [nid], f"nll_{reduction}")
    assert r.kernel.kind == "row_reduction" and r.kernel.params["rounds"] == 0      # no row walked


def test_nll_loss_ignored_and_out_of_range_targets():
    p, nid = nll_program((6, 5), "mean", ignore_index=2)
    r = fused(p, [nid], "nll_mean_ignored")
    x = torch.randn(6, 5).log_softmax(1)
    t = torch.full((6,), 2)
    (got,) = r([x.cuda(), t.cuda()])
    assert torch.isnan(got).all() and torch.isnan(F.nll_loss(x, t, ignore_index=2))  # 0 / 0, as torch
    t = torch.tensor([0, 2, 4, 1, 2, 3])
    (got,) = r([x.cuda(), t.cuda()])
    assert torch.allclose(got.cpu(), F.nll_loss(x, t, ignore_index=2), atol=1e-5)
    # torch raises on a class outside [0, C); the kernel gives NaN and reads nothing out of bounds
    q, nid = nll_program((6, 5), "none")
    rn = fused(q, [nid], "nll_none_bad")
    t = torch.tensor([0, 5, 4, -1, 1 << 40, 3])
    (got,) = rn([x.cuda(), t.cuda()])
    got = got.cpu()
    assert torch.isnan(got[[1, 3, 4]]).all()
    assert torch.allclose(got[[0, 2, 5]], -x[[0, 2, 5], [0, 4, 3]])
    s, nid = nll_program((6, 5), "sum")
    (got,) = fused(s, [nid], "nll_sum_bad")([x.cuda(), t.cuda()])
    assert torch.isnan(got).all()
