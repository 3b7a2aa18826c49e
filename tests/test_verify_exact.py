"""The float64 second opinion of a verification (verify.compare_exact): a float output that misses the
fp32 reference passes where it is as accurate as that reference against the float64 value, and only
then. The program sums 65536 terms of about 1e4 whose big parts cancel (sum(1e4 x + z) - sum(1e4 x)):
torch's own fp32 result is off by about 0.5, so a candidate that computes it exactly misses the fp32
reference by as much (as level 2's 14_Gemm_Divide_Sum_Scaling did, falling back)."""
import torch

from agent_core.verify import check_draws, exact_outputs, region_samples, verify_region
from tests.programs import cancelling_sum


def _exact(p, shift=0.0):
    """A candidate that computes the program in float64 (then float32), shifted by `shift`."""
    return lambda ins: [exact_outputs(p, p.inputs, p.outputs, ins)[0].float() + shift]


def test_an_exact_candidate_passes_where_the_fp32_reference_itself_is_off():
    p = cancelling_sum()
    ins, want = region_samples(p, p.inputs, p.outputs, 0)
    exact = exact_outputs(p, p.inputs, p.outputs, ins)[0]
    own = float((want[0].double() - exact).abs().max())
    assert own > 0.1, own           # torch's fp32 misses the float64 value by far more than 1e-4
    res = verify_region(p, p.inputs, p.outputs, _exact(p), device="cpu")
    assert res.ok and res.draws == 5, res.reason
    assert res.max_abs_err < 1e-3   # its error against the float64 value


def test_a_candidate_off_by_more_than_the_references_own_error_fails_and_says_both():
    p = cancelling_sum()
    res = verify_region(p, p.inputs, p.outputs, _exact(p, shift=3.0), device="cpu")
    assert not res.ok
    assert "tolerance atol=0.0001, rtol=0.0001" in res.reason, res.reason
    assert "against the float64 reference it is off by up to 3, torch's fp32 by up to" in res.reason, res.reason


def test_a_miss_far_beyond_rounding_gets_no_second_opinion():
    """A candidate off by more than 1% of the output's largest value is wrong: the float64 recomputation
    (seconds for a large region on a CPU) is not asked for."""
    p = cancelling_sum()
    asked = []

    def exact(ins):
        asked.append(1)
        return exact_outputs(p, p.inputs, p.outputs, ins)
    sample = lambda d: region_samples(p, p.inputs, p.outputs, d)      # noqa: E731
    far = check_draws(p, p.outputs, sample, lambda ins: [sample(0)[1][0] + 1e4], draws=1, device="cpu", exact=exact)
    assert not far.ok and asked == []
    near = check_draws(p, p.outputs, sample, _exact(p), draws=1, device="cpu", exact=exact)
    assert near.ok and asked == [1]


def test_without_a_second_opinion_the_fp32_verdict_stands():
    p = cancelling_sum()
    sample = lambda d: region_samples(p, p.inputs, p.outputs, d)      # noqa: E731
    res = check_draws(p, p.outputs, sample, _exact(p), draws=1, device="cpu")
    assert not res.ok and "tolerance atol=0.0001" in res.reason
    assert exact_outputs(p, ["nope"], p.outputs, [torch.zeros(1)]) is None     # cannot recompute: no opinion


def test_the_float64_recomputation_reads_the_programs_parameters():
    from agent_core.ir import Program
    from agent_core.reference import parameter_tensors
    p = Program("lin")
    x = p.add_input("x", (4, 8))
    w = p.add_parameter("w", shape=(3, 8))
    y = p.add_node("linear", [x.id, w.id]).outputs[0]
    p.mark_output(y)
    p.mark_output(p.add_node("exp", [x.id]).outputs[0])      # another output, not asked for
    ins = [torch.randn(4, 8)]
    (got,) = exact_outputs(p, [x.id], [y], ins)
    want = ins[0].double() @ parameter_tensors(p)[w.id].double().T
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=0, atol=1e-12)
