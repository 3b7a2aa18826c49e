"""Generated kernels are warning-free and carry no dead helpers: one region of each kind and schedule
compiles through NVRTC for sm_90 (which reports nvcc's front-end warnings, e.g. #177 for a variable
declared but never referenced) with an empty warning log, and every `__device__` helper the source
defines is called somewhere."""
import re

import pytest

from agent_core.codegen import generate_kernel
from agent_core.compiler import compile_kernel
from agent_core.ir import Program

HELPER_DEF = re.compile(r"__device__[^;{(]*?\b(\w+)\s*\([^;{]*\)[^;{]*\{")


def _chain(p, cur, ops):
    ids = []
    for op, extra, attrs in ops:
        n = p.add_node(op, [cur, *extra], attrs)
        ids.append(n.id)
        cur = n.outputs[0]
    p.mark_output(cur)
    return ids, cur


def pointwise_broadcast():
    p = Program("pw")
    x, b = p.add_input("x", [8, 16, 12, 12]), p.add_input("bias", [16, 1, 1])
    ids, out = _chain(p, x.id, [("add", [b.id], {}), ("gelu", [], {}), ("mul", [b.id], {})])
    return p, ids, {}


def row(op, shape, attrs, params=None):
    def build():
        p = Program(op)
        x, s = p.add_input("x", shape), p.add_input("scale", shape[-1:])
        ids, _ = _chain(p, x.id, [("mul", [s.id], {}), (op, [], attrs), ("relu", [], {})])
        return p, ids, params or {}
    return build


def column():
    p = Program("col")
    x = p.add_input("x", [4, 64, 48])
    ids, _ = _chain(p, x.id, [("exp", [], {}), ("sum", [], {"dim": [1]}), ("sqrt", [], {})])
    return p, ids, {}


def group_norm():
    p = Program("gn")
    x = p.add_input("x", [4, 32, 8, 8])
    w, b = p.add_parameter("weight", shape=[32]), p.add_parameter("bias", shape=[32])
    n = p.add_node("group_norm", [x.id, w.id, b.id], {"num_groups": 8})
    p.mark_output(n.outputs[0])
    return p, [n.id], {}


def layout_tile():
    p = Program("tile")
    x = p.add_input("x", [3, 40, 72])
    ids, _ = _chain(p, x.id, [("relu", [], {}), ("permute", [], {"dims": [0, 2, 1]}), ("neg", [], {})])
    return p, ids, {}


def pooling():
    p = Program("pool")
    x = p.add_input("x", [2, 8, 16, 16])
    ids, _ = _chain(p, x.id, [("max_pool2d", [], {"kernel_size": [2], "stride": [2]}), ("relu", [], {})])
    return p, ids, {}


def library_epilogue():
    p = Program("lib")
    x, w = p.add_input("x", [16, 64]), p.add_parameter("weight", shape=[96, 64])
    b = p.add_parameter("bias", shape=[96])
    ids, _ = _chain(p, x.id, [("linear", [w.id], {}), ("add", [b.id], {}), ("relu", [], {})])
    return p, ids, {}


CASES = {
    "pointwise_broadcast": pointwise_broadcast,
    "warp_softmax": row("softmax", [64, 512], {"dim": -1}),
    "warp_sum": row("sum", [64, 500], {"dim": [-1]}),
    "block_layer_norm": row("layer_norm", [16, 4096], {"normalized_shape": [4096]}),
    "stream_softmax": row("softmax", [8, 1 << 19], {"dim": -1}, {"split": 1}),   # longer than 8 CTAs hold
    "split_row_softmax": row("softmax", [8, 1 << 19], {"dim": -1}),   # few rows: chunks over the GPU
    "split_sum": row("sum", [4, 262144], {"dim": [-1]}),
    "column_sum": column,
    "group_norm": group_norm,
    "layout_tile": layout_tile,
    "pooling": pooling,
    "library_epilogue": library_epilogue,
}
SCHEDULES = {"warp_softmax": "warp", "warp_sum": "warp", "block_layer_norm": "block",
             "stream_softmax": "stream", "split_sum": "split_row", "split_row_softmax": "split_row"}


def unused_helpers(source: str) -> list[str]:
    code = re.sub(r"//[^\n]*", "", source)
    return [name for name in set(HELPER_DEF.findall(code)) if len(re.findall(rf"\b{name}\b", code)) < 2]


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_compiles_without_warnings_or_dead_helpers(case):
    program, ids, params = CASES[case]()
    ks = generate_kernel(program, ids, name=case, params=params)
    if case in SCHEDULES:
        assert ks.params["schedule"] == SCHEDULES[case]
    if case == "layout_tile":
        assert ks.params["tiled"]
    if case == "library_epilogue":
        assert ks.library_nodes
    assert unused_helpers(ks.source) == []
    log = compile_kernel(ks, arch="sm_90").log
    warnings = [ln for ln in log.splitlines() if "warning" in ln]
    assert warnings == [], "\n".join(warnings)


def test_unused_helper_check_sees_a_dead_helper():
    src = ("__device__ __forceinline__ float used(float x) { return x; }\n"
           "__device__ __forceinline__ float dead(float x) { return x; }\n"
           "extern \"C\" __global__ void k(float* y) { y[0] = used(1.0f); }\n")
    assert unused_helpers(src) == ["dead"]
