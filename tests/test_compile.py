"""NVRTC compilation: errors quote the region and the offending line, the disk cache hits, ptxas
statistics are read, and a region that cannot run here falls back to its unfused ops with a reason."""
import pytest
import torch

from agent_core.codegen import generate_kernel
from agent_core.compiler import CompileError, compile_kernel, compile_source
from agent_core.errors import StitchError
from agent_core.ir import Program
from agent_core.runtime import build_region
from agent_core.verify import compare, verify_region

GOOD = 'extern "C" __global__ void ok_kernel(float* __restrict__ y) {\n  y[threadIdx.x] = 1.0f;\n}\n'
BAD = 'extern "C" __global__ void bad_kernel(float* __restrict__ y) {\n  // fine\n  y[0] = undefined_thing + 1.0f;\n}\n'


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path))
    return tmp_path


def test_compile_error_names_region_and_quotes_line(fresh_cache):
    with pytest.raises(CompileError) as info:
        compile_source(BAD, "my_region", arch="sm_90")
    err = info.value
    assert isinstance(err, StitchError)
    assert err.line == 3 and err.region == "my_region"
    msg = str(err)
    assert "my_region" in msg and "line 3" in msg and "undefined_thing + 1.0f" in msg
    assert "\n" not in msg


def test_cache_hits_on_second_compile(fresh_cache):
    first = compile_source(GOOD, "ok_kernel", arch="sm_90")
    assert not first.cached and first.registers is not None and first.spill_stores == 0
    second = compile_source(GOOD, "ok_kernel", arch="sm_90")
    assert second.cached and second.key == first.key and second.cubin == first.cubin
    assert second.registers == first.registers
    other = compile_source(GOOD, "ok_kernel", arch="sm_90", options=("-std=c++17",))
    assert other.key != first.key and not other.cached
    assert (fresh_cache / "kernels" / f"{first.key}.cubin").exists()


def _chain():
    p = Program("chain")
    x = p.add_input("x", (3, 5))
    a = p.add_node("tanh", [x.id])
    b = p.add_node("mul_scalar", [a.outputs[0]], {"value": 3.0})
    p.mark_output(b.outputs[0])
    return p, [a.id, b.id]


def test_generated_kernel_compiles_with_statistics(fresh_cache):
    p, ids = _chain()
    c = compile_kernel(generate_kernel(p, ids, name="chain"), arch="sm_90")
    assert c.registers and "chain" in c.summary()


def test_verify_accepts_reference_and_rejects_a_wrong_candidate():
    p, ids = _chain()
    out = p.nodes[ids[-1]].outputs[0]
    x = p.inputs[0]
    good = verify_region(p, [x], [out], lambda ins: [torch.tanh(ins[0]) * 3.0], device="cpu")
    assert good.ok and good.draws == 5
    bad = verify_region(p, [x], [out], lambda ins: [torch.tanh(ins[0]) * 3.001], device="cpu")
    assert not bad.ok and "differs by" in bad.reason and "draw 0" in bad.reason
    ok, _, _, why = compare(p, out, torch.full((3, 5), float("nan")), torch.zeros(3, 5))
    assert not ok and "NaN" in why


def test_region_without_gpu_falls_back_with_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; tests/gpu covers the fused path")
    p, ids = _chain()
    runner = build_region(p, ids, name="chain", device="cpu")
    assert not runner.fused and runner.fallback_reason
    assert [e["event"] for e in runner.log][-1] == "fallback"
    x = torch.randn(3, 5)
    (y,) = runner([x])
    assert torch.allclose(y, torch.tanh(x) * 3.0)
