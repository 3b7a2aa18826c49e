"""Integer and bool inputs fuse instead of falling back: generated kernels load int64, int32, uint8,
int8 and bool values with their own C type, convert exactly where torch's type promotion does, and
write integer outputs where the op's output is integer.

Numerics without a GPU: the generated pointwise source itself is compiled for the host with g++ (CUDA's
keywords defined away, every thread launched in turn) and compared with the torch reference exactly,
on values that expose a lossy conversion (int64 above 2^24 and 2^40, -100 labels, uint8 / int8
wrap-around). Row-reduction kernels (warp shuffles) are compiled for sm_90 here and verified on the GPU
in tests/gpu/test_gpu_int_inputs.py.
"""
from __future__ import annotations

import ctypes
import math
import hashlib
import shutil
import subprocess

import numpy as np
import pytest
import torch

from agent_core.codegen import CodegenError, can_lower, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program
from agent_core.planner import plan_program
from agent_core.reference import parameter_tensors, run_reference

import int_programs as IP

HOST_SHIM = r"""
#include <math.h>
struct HostDim3 { unsigned x = 0, y = 1, z = 1; };
static HostDim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };
struct alignas(4) char4 { signed char x, y, z, w; };
"""

NP = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "uint8": np.uint8, "int8": np.int8,
      "bool": np.bool_}


@pytest.fixture(scope="module")
def host_dir(tmp_path_factory):
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.skip("no host C++ compiler to run the generated source on the CPU")
    return tmp_path_factory.mktemp("int_host")


def run_on_host(p: Program, ks, ins: dict, folder):
    """Compile ks for the host, launch every block and thread of its grid over ins (value id ->
    tensor), and return its outputs (value id -> tensor)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    n_args = len(ks.inputs) + len(ks.outputs)
    driver = (f'\nextern "C" void host_launch(void** args) {{\n'
              f"  gridDim.x = {ks.grid[0]}; blockDim.x = {ks.block[0]};\n"
              f"  for (unsigned b = 0; b < gridDim.x; ++b)\n"
              f"    for (unsigned t = 0; t < blockDim.x; ++t) {{\n"
              f"      blockIdx.x = b; threadIdx.x = t;\n"
              f"      {ks.name}({', '.join(f'(decltype({a}))args[{i}]' for i, a in enumerate(_params(ks)))});\n"
              f"    }}\n}}\n")
    # one file per source: dlopen hands back an already loaded library of the same path
    tag = hashlib.sha256(ks.source.encode()).hexdigest()[:12]
    src = folder / f"{ks.name}_{tag}.cpp"
    # the kernel's own parameter types, taken from its signature, type each argument
    src.write_text(HOST_SHIM + ks.source + _param_typedefs(ks) + driver)
    lib = folder / f"{ks.name}_{tag}.so"
    r = subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-fwrapv",
                        "-Wno-unknown-pragmas", str(src), "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    fn = ctypes.CDLL(str(lib)).host_launch
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    ins = {**parameter_tensors(p, "cpu"), **ins}   # constants (the -100) are kernel inputs too
    arrays = [np.ascontiguousarray(ins[v].numpy()) for v in ks.inputs]
    outs = [np.zeros(p.values[v].shape, dtype=NP[p.values[v].dtype]) for v in ks.outputs]
    fn((ctypes.c_void_p * n_args)(*[a.ctypes.data for a in arrays + outs]))
    return {v: torch.from_numpy(o) for v, o in zip(ks.outputs, outs)}


def _params(ks):
    return [f"P{i}" for i in range(len(ks.inputs) + len(ks.outputs))]


def _param_typedefs(ks):
    """`static T* P0;` ... for each kernel parameter, so the driver casts each void* to its type."""
    sig = ks.source.split(f"\n{ks.name}(", 1)[1].split(")", 1)[0]
    out = []
    for i, param in enumerate(sig.split(", ")):
        ctype = param.rsplit("__restrict__", 1)[0].strip()
        out.append(f"static {ctype} P{i};")
    return "\n" + "\n".join(out) + "\n"


def reference(p: Program, ins: dict):
    env = run_reference(p, {p.values[v].name: t for v, t in ins.items()}, device="cpu", keep=True)
    return env


@pytest.mark.parametrize("dtype", IP.DTYPES)
def test_pointwise_kernel_matches_torch_exactly_on_the_host(dtype, host_dir):
    p, ids = IP.every_int_op(dtype)
    ks = generate_kernel(p, ids, name=f"int_ops_{dtype}")
    ins = IP.draw(p, seed=0)
    want = reference(p, ins)
    got = run_on_host(p, ks, ins, host_dir)
    for v, t in got.items():
        w = want[v]
        assert t.dtype == w.dtype, (p.values[v].name, t.dtype, w.dtype)
        if t.is_floating_point():
            # a transcendental (exp) rounds as the host's libm does, torch's CPU kernels as their own
            # vector code does (it differs between CPUs): within an ulp, not bit for bit
            torch.testing.assert_close(t, w, rtol=2 ** -23, atol=0, equal_nan=True,
                                       msg=lambda m, v=v: f"{p.values[v].name}: {m}")
        else:
            assert torch.equal(t, w), (p.values[v].name, t.flatten()[:8], w.flatten()[:8])
    # full-size operands travel 4 lanes per access in their own type (int64: two 16-byte halves)
    vec = {"int64": "vec4_i64", "int32": "int4", "uint8": "uchar4", "int8": "char4", "bool": "vec4_bool"}[dtype]
    assert f"reinterpret_cast<const {vec}*>" in ks.source
    compiled = compile_kernel(ks, arch="sm_90")
    assert compiled.path.read_bytes()[:4] == b"\x7fELF"
    assert [ln for ln in compiled.log.splitlines() if "warning" in ln] == []   # e.g. #186 on uint8 >= 0


def test_int64_labels_compare_as_int64_and_mask_converts_where_torch_does():
    p, ids = IP.cross_entropy_mask()
    ks = generate_kernel(p, ids, name="ce_mask")
    src = ks.source
    # the comparison and the select never go through float
    assert "const bool eq = (attention_mask == one);" in src
    assert "const long long where = (eq ? labels : ignore);" in src
    assert "(float)" not in src and "long long* __restrict__ where" in src
    p2, ids2 = IP.mask_multiply()
    src2 = generate_kernel(p2, ids2, name="mask_mul").source
    assert "const float mul = (((float)mask) * x);" in src2   # torch: mask to float32, then the product


def test_host_run_catches_a_lossy_conversion(host_dir):
    """The oracle is strict enough: a kernel that passes int64 labels through float32 is caught."""
    p, ids = IP.cross_entropy_mask()
    ks = generate_kernel(p, ids, name="ce_lossy")
    ks.source = ks.source.replace("(eq ? labels : ignore)", "(eq ? (long long)(float)labels : ignore)")
    assert "(float)labels" in ks.source
    ins = IP.draw(p, seed=1)
    got = run_on_host(p, ks, ins, host_dir)
    want = reference(p, ins)
    assert not all(torch.equal(got[v], want[v]) for v in got)


@pytest.mark.parametrize("case", sorted(IP.ROW_CASES))
def test_row_reduction_with_integer_operands_generates_and_compiles(case):
    p, ids = IP.ROW_CASES[case]()
    assert can_lower(p, ids) is None
    ks = generate_kernel(p, ids, name=f"row_{case}")
    assert ks.kind == "row_reduction"
    compiled = compile_kernel(ks, arch="sm_90")
    assert compiled.spill_stores == 0 and compiled.spill_loads == 0, compiled.summary()
    assert [ln for ln in compiled.log.splitlines() if "warning" in ln] == []
    for v in ks.inputs:
        dt = p.values[v].dtype
        if dt != "float32":
            ctype = {"int64": "long long", "int32": "int", "uint8": "unsigned char", "int8": "signed char",
                     "bool": "bool"}[dt]
            assert f"const {ctype}* __restrict__" in ks.source


@pytest.mark.parametrize("case", sorted(IP.PLANNED))
def test_planner_proposes_generated_regions_over_the_integer_ops(case):
    """The planner asks can_lower, which now accepts integer inputs: the cast, the comparison, the mask
    multiply join their neighbours in generated regions instead of running alone through torch."""
    p, groups = IP.PLANNED[case]()
    plan = plan_program(p)
    for together in groups:
        (region,) = [r for r in plan.active if together[0] in r.nodes]
        assert set(together) <= set(region.nodes), (region.kind, region.nodes, region.reason)
        assert region.schedule.get("runs") == "kernel", region.reason
        assert can_lower(p, region.nodes, region.kind) is None
        ks = generate_kernel(p, region.nodes, name=f"planned_{case}", kind=region.kind)
        assert any(p.values[v].dtype != "float32" for v in ks.inputs + ks.outputs)
        compile_kernel(ks, arch="sm_90")


def test_refusals_name_the_value_and_the_dtype():
    for dtype in ("float64", "float16", "bfloat16"):
        p = Program("wide")
        x = p.add_input("x", (4, 4), dtype=dtype)
        n = p.add_node("relu", [x.id])
        p.mark_output(n.outputs[0])
        with pytest.raises(CodegenError, match=f"'x' has dtype {dtype}; generated kernels compute in float32, int64"):
            generate_kernel(p, [n.id], name="wide")
    # an op with no exact integer form is refused, never computed through float
    p = Program("ipow")
    a = p.add_input("a", (8,), dtype="int64")
    b = p.add_input("b", (8,), dtype="int64")
    n = p.add_node("pow", [a.id, b.id])
    p.mark_output(n.outputs[0])
    with pytest.raises(CodegenError, match=r"pow \(pow\) on int64 has no integer CUDA form"):
        generate_kernel(p, [n.id], name="ipow")
    # integer statistics other than a sum (which accumulates exactly in int64) are refused
    q = Program("imax")
    m = q.add_input("mask", (8, 32), dtype="int64")
    s = q.add_node("max", [m.id], {"dim": [1]})
    q.mark_output(s.outputs[0])
    with pytest.raises(CodegenError, match="reduces 'mask' of dtype int64; a row kernel accumulates float32, "
                                           "or int64 for a sum"):
        generate_kernel(q, [s.id], name="imax")


def _global_accesses(ks) -> tuple[set, set]:
    """The global load and store instructions of the kernel's PTX for sm_90."""
    import re
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    prog = nvrtc.createProgram(ks.source, f"{ks.name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=compute_90", "-std=c++17"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    return (set(re.findall(r"ld\.global(?:\.nc)?\.([\w.]+)", ptx)), set(re.findall(r"st\.global\.([\w.]+)", ptx)))


def test_integer_operands_keep_vector_accesses():
    """int64 moves 16 bytes (2 elements) per access, bytes 4 per access, next to float4 floats."""
    loads, stores = _global_accesses(generate_kernel(*IP.cross_entropy_mask(), name="ce_vec"))
    assert "v2.u64" in loads and "v2.u64" in stores
    loads, stores = _global_accesses(generate_kernel(*IP.mask_multiply("uint8"), name="u8_vec"))
    assert "v4.u8" in loads and "v4.f32" in loads and "v4.f32" in stores
    p, ids = IP.mask_softmax("int64")
    loads, _ = _global_accesses(generate_kernel(p, ids[:3], name="mask_arith_vec"))   # the mask arithmetic
    assert "v2.u64" in loads
    loads, _ = _global_accesses(generate_kernel(*IP.mask_count("int64"), name="cnt_vec"))
    assert "v2.u64" in loads


MASKED_BLOCKS = ["cross_entropy_llama2_32k", "cross_entropy_llama3_128k_smoothing", "masked_mean_pool_normalize_minilm",
                 "masked_softmax_bert_base"]


@pytest.mark.parametrize("block", MASKED_BLOCKS)
def test_masked_blocks_plan_their_integer_ops_into_generated_kernels(block, monkeypatch):
    """The blocks whose masks and labels fell back ("'labels' has dtype int64") now plan every
    integer op into a generated region, which generates and compiles."""
    from pathlib import Path

    from agent_core.importers import import_file
    monkeypatch.setenv("STITCHCUDA_BLOCKS_SMALL", "1")
    p = import_file(Path(__file__).resolve().parent.parent / "benchmarks" / "blocks" / f"{block}.py")
    plan = plan_program(p)
    assert not [r.reason for r in plan.active if "dtype" in r.reason]
    for r in plan.active:
        integer = any(p.values[v].dtype != "float32" for n in r.nodes for v in p.nodes[n].inputs if v)
        if integer and r.schedule.get("runs") == "kernel":
            compile_kernel(generate_kernel(p, r.nodes, name=f"{block}_{r.id}", kind=r.kind), arch="sm_90")


# --- random mixed-dtype chains, run on the host against torch ---------------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agent_core.errors import ShapeError  # noqa: E402

# ops whose float32 results are single IEEE operations (so the host run equals torch bit for bit)
CHAIN_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "gt", "le", "eq", "ne", "where_cond",
                "logical_and", "remainder")
CHAIN_UNARY = ("neg", "abs", "relu", "sign", "square", "logical_not", "cast_f32", "cast_i64", "cast_bool")


@st.composite
def mixed_chains(draw):
    p = Program("chain")
    dts = [draw(st.sampled_from(IP.DTYPES + ("float32",))) for _ in range(3)]
    pool = [p.add_input(f"in{k}", IP.SHAPE if k != 1 else IP.SHAPE[-1:], dt).id for k, dt in enumerate(dts)]
    ids = []
    for _ in range(draw(st.integers(2, 6))):
        op = draw(st.sampled_from(CHAIN_BINARY + CHAIN_UNARY))
        a, b = draw(st.sampled_from(pool)), draw(st.sampled_from(pool))
        name, attrs, ins = op, {}, [a, b]
        if op == "where_cond":
            c = draw(st.sampled_from(pool))
            name, ins = "where", [c, a, b]
        elif op.startswith("cast_"):
            name, attrs, ins = "cast", {"dtype": {"f32": "float32", "i64": "int64", "bool": "bool"}[op[5:]]}, [a]
        elif op in CHAIN_UNARY:
            ins = [a]
        if name == "remainder" and p.values[b].dtype not in ("int64", "int32"):
            continue                     # float remainder is floor arithmetic; integer b is drawn nonzero
        if name == "where" and p.values[ins[0]].dtype != "bool":
            continue                     # torch.where wants a bool condition
        try:
            n = p.add_node(name, ins, attrs)
        except ShapeError:
            continue                     # torch refuses this combination (e.g. sub of bools)
        ids.append(n.id)
        pool.append(n.outputs[0])
    produced = {v for nid in ids for v in p.nodes[nid].outputs}
    outs = [v for v in produced if math.prod(p.values[v].shape) == math.prod(IP.SHAPE)]
    if not outs:
        return None
    for v in outs:
        p.mark_output(v)
    return p, ids


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mixed_chains(), seed=st.integers(0, 3))
def test_random_mixed_dtype_chains_match_torch_exactly(case, seed, host_dir):
    if case is None or not case[1]:
        return
    p, ids = case
    ins = IP.draw(p, seed)
    for vid, t in ins.items():           # a divisor of remainder is never 0 (torch raises there)
        if not t.dtype.is_floating_point and t.dtype != torch.bool:
            t[t == 0] = 1
    try:
        want = reference(p, ins)
    except RuntimeError:
        return                           # torch itself refuses (an integer divided by zero)
    try:
        ks = generate_kernel(p, ids, name="chain")
    except CodegenError as exc:          # only the documented refusals
        assert any(why in str(exc) for why in ("no integer CUDA form", "smaller than the region",
                                                "kernels do not compute in")), str(exc)
        return
    got = run_on_host(p, ks, ins, host_dir)
    for v, t in got.items():
        assert t.dtype == want[v].dtype, (p.values[v].name, t.dtype, want[v].dtype)
        assert torch.equal(t, want[v]) or (t.dtype.is_floating_point and torch.allclose(
            t, want[v], atol=0, rtol=0, equal_nan=True)), (p.values[v].name, ks.source)


def test_float_remainder_is_torchs_bit_for_bit_where_the_quotient_is_large(host_dir):
    """torch takes fmod and moves it to b's sign; a - floor(a / b) * b loses the remainder once a / b is
    past float precision (hypothesis found 1.3e12 % -99: -1024 against torch's -68)."""
    p = Program("rem")
    a, b = p.add_input("a", (8,)).id, p.add_input("b", (8,)).id
    n = p.add_node("remainder", [a, b])
    p.mark_output(n.outputs[0])
    ins = {a: torch.tensor([1.391e12, -2.1577e12, 7.0, -7.0, 1e10, 5.5, 0.0, -3.0]),
           b: torch.tensor([-99.0, 3.7, 3.0, 3.0, -7.3, -2.0, 5.0, 3.0])}
    got = run_on_host(p, generate_kernel(p, [n.id], name="rem"), ins, host_dir)[n.outputs[0]]
    assert torch.equal(got, torch.remainder(ins[a], ins[b])), (got, torch.remainder(ins[a], ins[b]))


def test_a_comparison_promoted_to_a_dtype_kernels_lack_is_refused_plainly():
    # uint8 == int8 compares in int16 (torch.result_type): a clean refusal, so the region falls back
    from agent_core.ir import Program
    p = Program("mixed")
    a, b = p.add_input("a", (8,), "uint8").id, p.add_input("b", (8,), "int8").id
    eq = p.add_node("eq", [a, b])
    p.mark_output(eq.outputs[0])
    with pytest.raises(CodegenError, match="compares in torch.int16"):
        generate_kernel(p, [eq.id], name="mixed")
