"""GPU: the GPU executor launches proposals in a child process on guarded device buffers; it agrees
with the CPU emulator, keeps module state across the calls of one run, shows a write past an output in
the guard bytes, and reports an illegal address (fault), an infinite loop (hang) and, under
compute-sanitizer memcheck, a write past a whole buffer (sanitizer), each without harming the parent.

    PYTHONPATH=. python3 -m pytest -m gpu tests/gpu/test_writer_gpu_exec.py
"""
import shutil
import time

import numpy as np
import pytest
import torch

from agent_core.writer.executors import CANARY, ExecutionError, guarded, payload
from agent_core.writer.loop import default_executor
from agent_core.writer.gpu_exec import GpuExecutor
from tests.test_writer_emulate import (COUNTER, GUARD, HANG, PAST_END, POINTWISE, SOFTMAX, WILD, CpuExecutor,
                                       kernel)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
needs_sanitizer = pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")

GPU = GpuExecutor()


def run(ks, *calls, timeout_s=60.0, sanitize=False, executor=GPU):
    bufs = [[guarded(a, GUARD) for a in call] for call in calls]
    out = executor.run(ks, bufs, guard=GUARD, timeout_s=timeout_s, sanitize=sanitize)
    return out, [[payload(b, GUARD, a.dtype, a.shape) for b, a in zip(oc, call)] for oc, call in zip(out, calls)]


def test_the_default_executor_with_a_gpu_is_the_gpu_child():
    assert default_executor(gpu=True).name == "gpu"


def test_pointwise_on_the_gpu_matches_the_cpu_emulator_byte_for_byte():
    ks = kernel("axpb", POINTWISE, (3,), (128,))
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    gpu, [[_, y]] = run(ks, (x, np.zeros_like(x)))
    cpu, _ = run(ks, (x, np.zeros_like(x)), executor=CpuExecutor())
    np.testing.assert_array_equal(y, x * 2 + 1)
    assert all(np.array_equal(g, c) for g, c in zip(gpu[0], cpu[0]))


def test_block_softmax_on_the_gpu_matches_torch():
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    ks = kernel("softmax_rows", SOFTMAX, (4,), (128,), shared_bytes=300 * 4)
    _, [[_, y]] = run(ks, (x.numpy(), np.zeros((4, 300), np.float32)))
    torch.testing.assert_close(torch.from_numpy(y.copy()), torch.softmax(x, dim=1), atol=1e-5, rtol=1e-5)


def test_device_globals_keep_their_values_across_the_calls_of_one_run():
    ks = kernel("count_calls", COUNTER, (2,), (32,))
    calls = [(np.full(1, 10, np.float32), np.zeros(1, np.float32)) for _ in range(3)]
    _, results = run(ks, *calls)
    assert [float(y[0]) for _, y in results] == [10.0, 11.0, 12.0]


def test_a_write_past_the_output_changes_the_returned_guard_bytes():
    x = np.ones(64, np.float32)
    out, [[_, y]] = run(kernel("off_by_one", PAST_END, (3,), (32,)), (x, np.zeros(64, np.float32)))
    np.testing.assert_array_equal(y, x * 3)
    tail = out[0][1][GUARD + 64 * 4:]
    assert tail[:4].view(np.float32)[0] == 3.0 and (tail[4:] == CANARY).all()
    assert (out[0][1][:GUARD] == CANARY).all()


def test_an_illegal_address_is_a_fault_and_the_parent_keeps_working():
    with pytest.raises(ExecutionError) as info:
        run(kernel("wild", WILD, (1,), (32,)), (np.ones(4, np.float32), np.zeros(4, np.float32)))
    assert info.value.check == "fault" and "call 1 of 1" in str(info.value)
    assert "illegal" in str(info.value).lower() or "launch failure" in str(info.value).lower()
    assert float(torch.ones(3, device="cuda").sum()) == 3.0     # the parent's context is untouched
    _, [[_, y]] = run(kernel("count_calls", COUNTER, (1,), (32,)), (np.ones(1, np.float32), np.zeros(1, np.float32)))
    assert float(y[0]) == 1.0


def test_an_infinite_loop_is_a_hang_after_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        run(kernel("spin", HANG, (1,), (32,)), (np.ones(1, np.float32), np.zeros(1, np.float32)), timeout_s=2)
    assert info.value.check == "hang"
    assert time.monotonic() - t0 < 60        # startup (CuPy, context) plus the 2 s of launch


BEYOND = r"""
#define GUARD_FLOATS 64                     // the tests' 256 guard bytes
extern "C" __global__ void beyond(const float* x, float* y) {
    if (threadIdx.x == 0) y[64 + GUARD_FLOATS + 16] = x[0];   // 64 bytes past the whole guarded buffer
}
"""


@needs_sanitizer
def test_memcheck_reports_a_write_past_the_whole_buffer():
    ks = kernel("beyond", BEYOND, (1,), (32,))
    with pytest.raises(ExecutionError) as info:
        run(ks, (np.ones(64, np.float32), np.zeros(64, np.float32)), sanitize=True)
    assert info.value.check == "sanitizer"
    assert "Invalid __global__ write" in str(info.value) and "ERROR SUMMARY" in str(info.value)


@needs_sanitizer
def test_a_clean_kernel_passes_under_memcheck():
    x = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    _, [[_, y]] = run(kernel("axpb", POINTWISE, (3,), (128,)), (x, np.zeros_like(x)), sanitize=True)
    np.testing.assert_array_equal(y, x * 2 + 1)
