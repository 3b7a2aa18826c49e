"""Kernels with indices: argmax / argmin (int64 results) and cumsum / cumprod (scans). Each
configuration generates the schedule it should, compiles through NVRTC for sm_90 without warnings or
spills, and a representative set compiles with nvcc, warnings on, to nothing; regions these generators
do not handle are refused with the reason. (Numerics are checked on the GPU: tests/gpu/test_gpu_indexed.py.
A lone nll_loss is a class loss: tests/test_codegen_class_loss.py.)"""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_core.codegen import CodegenError, generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.importers import import_file
from agent_core.ir import Program
from tests.programs import arg_program, scan_program

EXAMPLES = Path(__file__).resolve().parents[1] / "resources" / "examples"
# tools/kernel_warnings.py compiles the examples' kernels with these
NVCC_FLAGS = ["-arch=sm_90", "-c", "-std=c++17", "-Xcudafe", "--display_error_number",
              "-Wno-deprecated-gpu-targets", "-Xptxas", "-warn-spills"]


def compiled_clean(ks):
    c = compile_kernel(ks, arch="sm_90")
    warnings = [ln for ln in c.log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)
    assert c.spill_stores == 0, c.summary()
    return c


# --- argmax / argmin ----------------------------------------------------------------------------
# argmax / argmin are a (value, index) state of the row graph (codegen/rowops.py, rendered by
# rowkernel.py), a scalar and rows of one element included. Numerics under CPU emulation:
# tests/test_rowgraph_argmax_norm.py; on the GPU: tests/gpu/test_gpu_indexed.py.
ARG_CASES = [  # shape, dim, keepdim, kernel kind
    ((64, 1000), 1, False, "row_reduction"),
    ((64, 1000), -1, True, "row_reduction"),
    ((9, 7), 0, False, "row_reduction"),        # a short strided dim: column tiles
    ((40, 33), 0, True, "row_reduction"),
    ((6, 5, 7), -1, True, "row_reduction"),
    ((3, 5, 40), 1, False, "row_reduction"),
    ((4, 10, 3), 1, True, "row_reduction"),
    ((64, 100), None, False, "row_reduction"),  # the flattened tensor: one row of 6400
    ((3, 4, 5), None, True, "row_reduction"),
    ((5, 3000), -1, False, "row_reduction"),
    ((3, 17001), 1, False, "row_reduction"),    # streamed, odd length
    ((7, 2000, 3), 1, False, "row_reduction"),  # long and strided
    ((33,), None, False, "row_reduction"),
    ((1,), 0, False, "row_reduction"),          # a single element: one row of one
    ((), None, False, "row_reduction"),         # a scalar: the same
]


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("shape,dim,keepdim,kind", ARG_CASES,
                         ids=[f"{'x'.join(map(str, c[0])) or 'scalar'}-dim{c[1]}{'-keep' if c[2] else ''}"
                              for c in ARG_CASES])
def test_arg_reduction_compiles(op, shape, dim, keepdim, kind):
    p, nid = arg_program(op, shape, dim, keepdim)
    ks = generate_kernel(p, [nid], name=f"{op}_k")
    assert ks.kind == kind, ks.params
    assert "long long* __restrict__" in ks.source and "const float* __restrict__ x" in ks.source
    # torch's order: NaN wins, and on equal values the smaller index wins
    assert f"bool better_{op}(float a, long long ia, float b, long long ib)" in ks.source
    assert f"(a {'>' if op == 'argmax' else '<'} b || (a == b && ia < ib))" in ks.source
    assert f"fold_{op}(" in ks.source and ", c);" in ks.source
    assert ks.block[0] * ks.block[1] <= 1024
    compiled_clean(ks)


def test_arg_reduction_shapes_in_the_source():
    p, nid = arg_program("argmax", (4, 6, 5), 1)
    ks = generate_kernel(p, [nid], name="am")
    assert "kCols = 6;" in ks.source and "kInner = 5;" in ks.source and "[4, 6, 5]: 20 rows of 6" in ks.source
    p, nid = arg_program("argmin", (3, 7), None, keepdim=True)
    ks = generate_kernel(p, [nid], name="am_flat")
    assert "kCols = 21;" in ks.source and ks.grid == (1, 1, 1)


# --- cumsum / cumprod ---------------------------------------------------------------------------
SCAN_CASES = [  # shape, dim: rows of one element, of a warp's share, of a block's, long rows; middle dims
    ((6, 1), 1), ((6, 33), 1), ((6, 1000), -1), ((3, 5000), 1), ((2, 70001), -1), ((4, 1, 7), 1), ((4, 33, 5), 1),
    ((2, 1000, 3), 1), ((2, 5000, 3), 1), ((3, 40, 64), 1), ((1000, 40), 0), ((17,), 0),
]


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("shape,dim", SCAN_CASES, ids=[f"{'x'.join(map(str, c[0]))}-dim{c[1]}" for c in SCAN_CASES])
def test_scan_compiles(op, shape, dim):
    """Every scan is the row graph's (rowscan.py); its numerics against torch: test_rowgraph_scan.py."""
    p, nid = scan_program(op, shape, dim)
    ks = generate_kernel(p, [nid], name=f"{op}_k")
    assert ks.kind == "row_reduction" and ks.params["cols"] == shape[dim]
    # accumulated in double, each output rounded once (the correctly rounded scan, as the reference)
    assert re.search(r"double \w+_carry", ks.source), ks.source
    compiled_clean(ks)


# --- refusals -----------------------------------------------------------------------------------
def test_refusals_name_the_reason():
    p = Program("r")
    x = p.add_input("x", (4, 8))
    r = p.add_node("relu", [x.id])
    a = p.add_node("argmax", [r.outputs[0]], {"dim": 1})
    p.mark_output(a.outputs[0])
    # a pointwise producer now joins the argmax's row kernel; an integer input is refused there
    assert generate_kernel(p, [r.id, a.id], name="two").kind == "row_reduction"
    z = Program("z")
    w = z.add_input("w", (4, 8), "int64")
    aw = z.add_node("argmax", [w.id], {"dim": 1})
    z.mark_output(aw.outputs[0])
    with pytest.raises(CodegenError, match="dtype int64"):
        generate_kernel(z, [aw.id], name="ints")
    q = Program("i")
    y = q.add_input("y", (4, 8), "int64")
    c = q.add_node("cumsum", [y.id], {"dim": 1})
    q.mark_output(c.outputs[0])
    with pytest.raises(CodegenError, match="int64.*running sums are generated for float32 only"):
        generate_kernel(q, [c.id], name="int_scan")
    e = Program("empty")
    z = e.add_input("z", (0, 5))
    m = e.add_node("cumprod", [z.id], {"dim": 1})
    e.mark_output(m.outputs[0])
    with pytest.raises(CodegenError, match="empty tensor"):
        generate_kernel(e, [m.id], name="empty")


# --- the bundled examples -----------------------------------------------------------------------
@pytest.mark.parametrize("example,ops", [("argmax_argmin", {"argmax", "argmin"}), ("cumsum_rows", {"cumsum"})])
def test_examples_generate_and_compile(example, ops):
    p = import_file(EXAMPLES / f"{example}.py")
    nodes = [n for n in p.nodes.values() if n.op in ops]
    assert {n.op for n in nodes} == ops
    for n in nodes:
        ks = generate_kernel(p, [n.id], name=f"{example}_{n.id}")
        assert ks.params["schedule"] == "warp" and ks.params["vector_width"] == 4
        compiled_clean(ks)


# --- nvcc, warnings on --------------------------------------------------------------------------
NVCC_CASES = [
    lambda: arg_program("argmax", (64, 1000), 1), lambda: arg_program("argmin", (40, 33), 0, True),
    lambda: arg_program("argmax", (3, 17001), 1), lambda: arg_program("argmin", (7, 2000, 3), 1),
    lambda: scan_program("cumsum", (6, 1000), 1), lambda: scan_program("cumprod", (2, 5000, 3), 1),
    lambda: scan_program("cumsum", (3, 40, 64), 1), lambda: scan_program("cumprod", (6, 33), 1),
]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_without_warnings(tmp_path):
    def build(k):
        p, nid = NVCC_CASES[k]()
        ks = generate_kernel(p, [nid], name=f"nvcc_{k}")
        cu = tmp_path / f"k{k}.cu"
        cu.write_text(ks.source)
        r = subprocess.run(["nvcc", *NVCC_FLAGS, str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        return ks.name, r.returncode, (r.stdout + r.stderr).strip()

    with ThreadPoolExecutor(2) as pool:
        for name, rc, log in pool.map(build, range(len(NVCC_CASES))):
            assert rc == 0 and "warning" not in log, f"{name}:\n{log}"
