"""fp32 with the reduction cut into parts (runtime/split_k.py), on the CPU: where it applies (few output
tiles, a long K, enough rows), that it is the same sum as fp32 for linears and matmuls of every
operand layout, that it is one batched GEMM over views of the operands, and that the agent offers it
as a form and the runtime runs it when chosen. tests/gpu/test_split_k_gpu.py times it."""
import os
import tempfile

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agent_core.agent.precision import candidates
from agent_core.ir import Program
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import split_k as sk
from agent_core.runtime.split_tf32 import describe_library_call, run_library_node


def _program(op, a_shape, b_shape, bias=True):
    p = Program(op)
    x = p.add_input("x", a_shape)
    ins = [x.id, p.add_parameter("w", shape=b_shape).id]
    if bias and op == "linear":
        ins.append(p.add_parameter("b", shape=(b_shape[0] if op == "linear" else b_shape[1],)).id)
    n = p.add_node(op, ins, {})
    p.mark_output(n.outputs[0])
    return p, n


@pytest.mark.parametrize("op,a,b,want", [
    ("linear", (2, 197, 2048), (512, 2048), 8),     # ViT-B's MLP out at batch 2: 16 tiles -> 128
    ("linear", (394, 512), (2048, 512), 2),         # its MLP in: 64 tiles, K 512 -> two parts of 256
    ("matmul", (300, 4096), (4096, 256), 16),       # 6 tiles: 16 parts of 256 (32 of 128 too short)
    ("linear", (8192, 768), (3072, 768), 1),        # GPT-2's MLP: 1536 tiles, nothing to gain
    ("linear", (16, 4096), (256, 4096), 1),         # 16 rows: a matrix-vector product in all but name
    ("linear", (394, 2050), (512, 2050), 2),        # K = 2 x 1025: two parts, no more
    ("linear", (394, 2049), (512, 2049), 1),        # an odd K
])
def test_where_the_reduction_is_cut(op, a, b, want):
    p, n = _program(op, a, b)
    assert sk.parts(p, n.id) == want
    assert sk.can_split_k(p, n.id) == (want > 1)
    assert (sk.SPLIT_K in candidates(p, n.id)) == (want > 1)


def test_only_linears_and_matmuls_by_a_matrix_are_cut():
    p = Program("bmm")
    x, y = p.add_input("x", (4, 300, 4096)), p.add_input("y", (4, 4096, 256))
    n = p.add_node("bmm", [x.id, y.id], {})
    p.mark_output(n.outputs[0])
    assert sk.parts(p, n.id) == 1


@pytest.mark.parametrize("op,a,b,bias,transposed", [
    ("linear", (2, 197, 2048), (512, 2048), True, False),
    ("linear", (394, 2048), (512, 2048), False, False),
    ("linear", (394, 2048), (512, 2048), True, True),        # the activation a transposed view
    ("matmul", (300, 4096), (4096, 256), False, False),
])
def test_the_same_sum_as_fp32(op, a, b, bias, transposed):
    p, n = _program(op, a, b, bias)
    env = dict(parameter_tensors(p, "cpu"))
    x = torch.randn(a[::-1]).mT if transposed else torch.randn(a)
    assert x.shape == a and x.is_contiguous() != transposed
    env[p.inputs[0]] = x
    exact = n.opdef.reference([env[v].double() for v in n.inputs], n.attrs)
    fp32, cut = dict(env), dict(env)
    run_node(p, n.id, fp32)
    sk.run_split_k(p, n.id, cut)
    out = n.outputs[0]
    assert cut[out].shape == fp32[out].shape and cut[out].dtype == torch.float32
    err = lambda t: float((t.double() - exact).abs().max())
    assert err(cut[out]) <= 2 * err(fp32[out]) + 1e-6, (err(cut[out]), err(fp32[out]))


class _Calls(TorchDispatchMode):
    def __enter__(self):
        self.calls = []
        super().__enter__()
        return self.calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func.overloadpacket.__name__,
                           [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]))
        return func(*args, **(kwargs or {}))


def test_one_batched_gemm_over_views_then_one_sum():
    """The parts are views of the operands (no copy before the GEMM), the s partial products one bmm."""
    p, n = _program("linear", (2, 197, 2048), (512, 2048))
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(2, 197, 2048)
    with _Calls() as calls:
        sk.run_split_k(p, n.id, env)
    ops = [c[0] for c in calls if c[0] not in ("view", "_unsafe_view", "transpose", "permute", "unflatten",
                                              "reshape", "expand", "t")]
    assert ops == ["bmm", "sum", "add_"], calls
    assert dict(calls)["bmm"] == [(8, 394, 256), (8, 256, 512)]


def test_the_runtime_runs_the_chosen_form_and_names_it():
    p, n = _program("linear", (2, 197, 2048), (512, 2048))
    p.metadata["library_precision"] = {n.id: sk.SPLIT_K}
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(2, 197, 2048)
    with _Calls() as calls:
        run_library_node(p, n.id, env)
    assert "bmm" in [c[0] for c in calls] and "addmm" not in [c[0] for c in calls]
    assert "cut into parts" in describe_library_call(p, n.id)
    with _Calls() as calls:
        run_library_node(p, n.id, dict(env), form="fp32")       # the memory plan's plain fp32
    assert "bmm" not in [c[0] for c in calls]


def test_the_memory_plan_counts_its_partial_products():
    """s partial outputs live while the call runs: the plan models them, so the chooser's measured
    temporaries are compared with the right figure and the predicted peak includes them."""
    from agent_core.program_runtime.memory_plan import call_temp_bytes
    p, n = _program("linear", (2, 197, 2048), (512, 2048))
    out = p.values[n.outputs[0]].nbytes
    assert call_temp_bytes(p, n.id, sk.SPLIT_K, False) == 8 * out
    assert call_temp_bytes(p, n.id, "fp32", False) == 0


def test_a_tight_memory_budget_cuts_fewer_parts_and_everything_agrees_on_them():
    """Where the memory budget leaves room for fewer partial products than fill the SMs (a batch-2 ViT:
    eager's peak is 6.9 MiB), the agent fixes the most that fit; the runtime's GEMM, the memory plan's
    model and a saved program all use that count, and no room for two drops the form."""
    from agent_core.agent.precision import over_room
    from agent_core.program_runtime.memory_plan import call_temp_bytes
    from agent_core.project_file import load_program, save_program
    p, n = _program("linear", (2, 197, 2048), (512, 2048))
    out = p.values[n.outputs[0]].nbytes                      # 0.8 MB
    room = int(2.3 * 2**20)
    assert sk.parts_within(p, n.id, room) == 2 and sk.parts_within(p, n.id, None) == 8
    assert over_room(p, n.id, [sk.SPLIT_K], room) == []
    sk.fit_parts(p, n.id, room)
    assert sk.parts(p, n.id) == 2
    assert call_temp_bytes(p, n.id, sk.SPLIT_K, False) == 2 * out
    env = dict(parameter_tensors(p, "cpu"))
    env[p.inputs[0]] = torch.randn(2, 197, 2048)
    fp32 = dict(env)
    run_node(p, n.id, fp32)
    with _Calls() as calls:
        sk.run_split_k(p, n.id, env)
    assert dict(calls)["bmm"] == [(2, 394, 1024), (2, 1024, 512)]
    torch.testing.assert_close(env[n.outputs[0]], fp32[n.outputs[0]], rtol=1e-5, atol=1e-5)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.json")
        save_program(p, path)
        assert sk.parts(load_program(path), n.id) == 2
    sk.fit_parts(p, n.id, None)                               # no budget: the count that fills the SMs
    assert sk.parts(p, n.id) == 8
    assert over_room(p, n.id, [sk.SPLIT_K], out + out // 2) == [sk.SPLIT_K]
