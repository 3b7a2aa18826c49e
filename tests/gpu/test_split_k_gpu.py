"""On the GPU: fp32 with the reduction cut into parts (runtime/split_k.py). As accurate as cuBLAS's fp32
call against float64, captured and replayed in a CUDA graph, and timed beside it (printed: performance
is judged in benchmarks, not here); the agent's choice for the node is printed with its reason.

PYTHONPATH=. python3 -m pytest -m gpu -s tests/gpu/test_split_k_gpu.py
"""
import io

import pytest
import torch

from agent_core.agent import EventEmitter, read_events
from agent_core.agent.precision import choose_library_precision
from agent_core.reference import parameter_tensors, run_node
from agent_core.runtime import split_k as sk
from tests.test_split_k import _program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = [("linear", (2, 197, 2048), (512, 2048)),     # ViT-B's MLP out (KernelBench level 3, 28)
          ("linear", (512, 4096), (1024, 4096)),
          ("matmul", (300, 8192), (8192, 256))]


def _ms(fn, trials=50):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(trials):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@pytest.mark.parametrize("op,a,b", SHAPES, ids=[f"{s[0]}-{s[1][-1]}x{s[2]}" for s in SHAPES])
def test_as_accurate_as_fp32_and_captured_in_a_graph(op, a, b):
    p, n = _program(op, a, b)
    assert sk.can_split_k(p, n.id)
    env = dict(parameter_tensors(p, "cuda"))
    env[p.inputs[0]] = torch.randn(a, device="cuda")
    exact = n.opdef.reference([env[v].double() for v in n.inputs], n.attrs)
    out = n.outputs[0]
    fp32, cut = dict(env), dict(env)
    run_node(p, n.id, fp32)
    sk.run_split_k(p, n.id, cut)
    err = lambda t: float((t.double() - exact).abs().max())
    print(f"{op} {a} x {b}: {sk.parts(p, n.id)} parts; worst error against float64 {err(cut[out]):.3g}, "
          f"fp32 {err(fp32[out]):.3g}; fp32 {_ms(lambda: run_node(p, n.id, dict(env))):.4f} ms, "
          f"split K {_ms(lambda: sk.run_split_k(p, n.id, dict(env))):.4f} ms")
    assert err(cut[out]) <= 2 * err(fp32[out]) + 1e-6
    g, replayed = torch.cuda.CUDAGraph(), dict(env)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sk.run_split_k(p, n.id, dict(env))       # warm-up outside the capture
        with torch.cuda.graph(g, stream=stream):
            sk.run_split_k(p, n.id, replayed)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed[out], cut[out])


def test_the_agent_times_it_and_says_what_it_chose():
    p, n = _program(*SHAPES[0])
    params = dict(parameter_tensors(p, "cuda"))
    buf = io.StringIO()

    def tensors_for(vids):
        return [params[v] if v in params else torch.randn(p.values[v].shape, device="cuda") for v in vids]
    choose_library_precision(p, tensors_for, EventEmitter(buf), trials=20)
    [e] = [e for e in read_events(buf.getvalue().splitlines()) if e["event"] == "precision"]
    print(e["chosen"], e["reason"], {k: v for k, v in e.items() if k.endswith("_ms")})
    assert "fp32_splitk_ms" in e and e["chosen"] in ("fp32", sk.SPLIT_K, "3xtf32", "3xtf32-cat")
