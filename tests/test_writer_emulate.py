"""The CPU executor runs real CUDA kernels on guarded buffers in a child process: vector loads,
shared memory, barriers, warp shuffles, atomics and module state behave as on a GPU; a write past an
output shows in the returned guard bytes; a block spin-waiting on later blocks runs beside them,
each with its own shared memory; hangs, deadlocks, crashes, too much work and constructs the shim
cannot run are reported with their check; a region-sized kernel runs in seconds, in the same
order every time. Executables are cached, so a rerun takes seconds."""
import time

import numpy as np
import pytest
import torch

from agent_core.codegen.kernel import KernelSource
from agent_core.errors import StitchError
from agent_core.writer.emulate import CpuExecutor, build
from agent_core.writer.endpoint import WriterError
from agent_core.writer.executors import CANARY, ExecutionError, guarded, payload
from agent_core.writer.loop import default_executor

GUARD = 256
CPU = CpuExecutor()


def kernel(name, source, grid, block, shared_bytes=0, inputs=("x",), outputs=("y",)):
    pad = lambda t: tuple(t) + (1,) * (3 - len(t))
    return KernelSource(name=name, kind="writer", source=source, node_ids=[], inputs=list(inputs),
                        outputs=list(outputs), grid=pad(grid), block=pad(block), shared_bytes=shared_bytes)


def run(ks, *calls, timeout_s=30.0):
    """Each call: arrays, one per kernel argument; returns each call's payloads after it ran."""
    bufs = [[guarded(a, GUARD) for a in call] for call in calls]
    out = CPU.run(ks, bufs, guard=GUARD, timeout_s=timeout_s)
    return out, [[payload(b, GUARD, a.dtype, a.shape) for b, a in zip(oc, call)] for oc, call in zip(out, calls)]


POINTWISE = r"""
#define N 4096
extern "C" __global__ void __launch_bounds__(128) axpb(const float* __restrict__ x, float* __restrict__ y) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    #pragma unroll 2
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N / 4; i += gridDim.x * blockDim.x) {
        float4 v = __ldg(&x4[i]);
        y4[i] = make_float4(fmaf(v.x, 2.0f, 1.0f), fmaf(v.y, 2.0f, 1.0f), fmaf(v.z, 2.0f, 1.0f), fmaf(v.w, 2.0f, 1.0f));
    }
}
"""


def test_float4_grid_stride_pointwise():
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    _, [[x_after, y]] = run(kernel("axpb", POINTWISE, (3,), (128,)), (x, np.zeros_like(x)))
    np.testing.assert_array_equal(y, x * 2 + 1)
    np.testing.assert_array_equal(x_after, x)


SOFTMAX = r"""
#define COLS 300
#define NEG_INF __int_as_float(0xff800000)   // NVRTC has no INFINITY without headers
__device__ __forceinline__ float warp_max(float v) {
    for (int o = warpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
    return __shfl_sync(0xffffffff, v, 0);
}
// one block per row: the row is staged in dynamic shared memory, warps combine through a static array
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) float row[];
    static __shared__ float part[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const float* xr = x + blockIdx.x * COLS;
    float m = NEG_INF;
    for (int c = threadIdx.x; c < COLS; c += blockDim.x) { row[c] = xr[c]; m = max(m, row[c]); }
    m = warp_max(m);
    if (lane == 0) part[warp] = m;
    __syncthreads();
    m = warp_max(lane < warps ? part[lane] : NEG_INF);
    __syncthreads();
    float s = 0.0f;
    for (int c = threadIdx.x; c < COLS; c += blockDim.x) { row[c] = __expf(row[c] - m); s += row[c]; }
    s = warp_sum(s);
    if (lane == 0) part[warp] = s;
    __syncthreads();
    s = warp_sum(lane < warps ? part[lane] : 0.0f);
    const float inv = __frcp_rn(s);
    for (int c = threadIdx.x; c < COLS; c += blockDim.x) y[blockIdx.x * COLS + c] = row[c] * inv;
}
"""


def test_block_softmax_with_shared_memory_barriers_and_shuffles_matches_torch():
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    ks = kernel("softmax_rows", SOFTMAX, (4,), (128,), shared_bytes=300 * 4)
    _, [[_, y]] = run(ks, (x.numpy(), np.zeros((4, 300), np.float32)))
    torch.testing.assert_close(torch.from_numpy(y.copy()), torch.softmax(x, dim=1), atol=1e-5, rtol=1e-5)


EARLY_RETURN = r"""
extern "C" __global__ void partial_sum(const float* x, float* y) {
    __shared__ float s[64];
    if (threadIdx.x >= 40) return;            // 24 threads leave before the barriers
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < 40; ++i) t += s[i];
        y[0] = t;
    }
    __syncthreads();
    y[1 + threadIdx.x] = s[39 - threadIdx.x];
}
"""


def test_threads_that_return_before_a_barrier_do_not_deadlock_the_others():
    x = np.arange(64, dtype=np.float32)
    _, [[_, y]] = run(kernel("partial_sum", EARLY_RETURN, (1,), (64,)), (x, np.zeros(41, np.float32)), timeout_s=10)
    assert y[0] == x[:40].sum()
    np.testing.assert_array_equal(y[1:], x[:40][::-1])


SCAN = r"""
// per-warp inclusive scan with __shfl_up_sync over a block of 48 threads: the second warp has 16 lanes
typedef long long int64_t;     // as NVRTC sources without <cstdint> write it (glibc's is `long`)
extern "C" __global__ void warp_scan(const int* x, int* y, unsigned* votes) {
    const int lane = threadIdx.x & 31;
    int64_t v = x[threadIdx.x];
    for (int d = 1; d < 32; d <<= 1) {
        int64_t u = __shfl_up_sync(0xffffffff, v, d);   // an 8-byte shuffle
        if (lane >= d) v += u;
    }
    y[threadIdx.x] = (int)v;
    unsigned b = __ballot_sync(__activemask(), x[threadIdx.x] % 2 == 1);
    if (lane == 0) votes[threadIdx.x / 32] = b;
}
"""


def test_warp_scan_and_ballot_on_a_partial_warp():
    x = np.random.default_rng(2).integers(0, 9, 48).astype(np.int32)
    ks = kernel("warp_scan", SCAN, (1,), (48,), inputs=["x"], outputs=["y", "votes"])
    _, [[_, y, votes]] = run(ks, (x, np.zeros(48, np.int32), np.zeros(2, np.uint32)))
    np.testing.assert_array_equal(y, np.concatenate([np.cumsum(x[:32]), np.cumsum(x[32:])]))
    expect = [sum(1 << j for j in range(len(w)) if w[j] % 2) for w in (x[:32], x[32:])]
    assert votes.tolist() == expect


ATOMIC = r"""
extern "C" __global__ void atomic_sum(const float* x, float* total, int* biggest) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 5000; i += gridDim.x * blockDim.x) {
        atomicAdd(total, x[i]);
        atomicMax(biggest, (int)(x[i] * 1000.0f));
    }
}
"""


def test_atomic_add_reduction():
    x = np.random.default_rng(3).random(5000).astype(np.float32)
    ks = kernel("atomic_sum", ATOMIC, (4,), (128,), outputs=["total", "biggest"])
    _, [[_, total, biggest]] = run(ks, (x, np.zeros(1, np.float32), np.zeros(1, np.int32)))
    assert total[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-4)
    assert biggest[0] == int((x * np.float32(1000.0)).astype(np.int32).max())


COUNTER = r"""
__device__ int launches;                      // module state: kept from one call to the next
extern "C" __global__ void count_calls(const float* x, float* y) {
    if (blockIdx.x == 0 && threadIdx.x == 0) y[0] = x[0] + launches++;
}
"""


def test_device_globals_keep_their_values_across_the_calls_of_one_run():
    ks = kernel("count_calls", COUNTER, (2,), (32,))
    calls = [(np.full(1, 10, np.float32), np.zeros(1, np.float32)) for _ in range(3)]
    _, results = run(ks, *calls)
    assert [float(y[0]) for _, y in results] == [10.0, 11.0, 12.0]
    _, again = run(ks, *calls[:1])
    assert float(again[0][1][0]) == 10.0      # a new run is a fresh module


PAST_END = r"""
extern "C" __global__ void off_by_one(const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= 64) y[i] = x[i % 64] * 3.0f;     // <= : one element past the output
}
"""


def test_a_write_past_the_output_changes_the_returned_guard_bytes():
    x = np.ones(64, np.float32)
    out, [[x_after, y]] = run(kernel("off_by_one", PAST_END, (3,), (32,)), (x, np.zeros(64, np.float32)))
    np.testing.assert_array_equal(y, x * 3)
    buf = out[0][1]
    assert (buf[:GUARD] == CANARY).all()
    tail = buf[GUARD + 64 * 4:]
    assert len(tail) == GUARD and not (tail[:4] == CANARY).all() and (tail[4:] == CANARY).all()
    assert tail[:4].view(np.float32)[0] == 3.0
    assert (out[0][0][GUARD + 64 * 4:] == CANARY).all() and np.array_equal(x_after, x)


HANG = r"""
extern "C" __global__ void spin(const float* x, float* y) {
    while (x[0] == x[0]) { y[0] += 1.0f; }
}
"""


def test_an_infinite_loop_is_a_hang_reported_after_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        run(kernel("spin", HANG, (1,), (32,)), (np.ones(1, np.float32), np.zeros(1, np.float32)), timeout_s=2)
    assert info.value.check == "hang" and "did not finish in 2 s under CPU emulation" in str(info.value)
    assert time.monotonic() - t0 < 15       # compiling (uncached) plus the 2 s, not the default 60


DEADLOCK = r"""
extern "C" __global__ void split_warp(const float* x, float* y) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) __syncthreads();                    // half the warp waits at the barrier,
    else v = __shfl_sync(0xffffffffu, v, 0);                  // the other half for lanes that never come
    y[threadIdx.x] = v;
}
"""


def test_threads_waiting_for_each_other_forever_are_a_hang_said_at_once():
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        run(kernel("split_warp", DEADLOCK, (1,), (32,)), (np.ones(32, np.float32), np.zeros(32, np.float32)),
            timeout_s=30)
    err = str(info.value)
    assert info.value.check == "hang" and "deadlock in block (0, 0, 0)" in err
    assert "16 threads wait at __syncthreads, 16 at a warp collective" in err
    assert time.monotonic() - t0 < 15       # found when every thread waits, not after the 30 s


WAIT_FOR_LATER_BLOCKS = r"""
// each block keeps its index in shared memory, counts itself in, then spins until all 6 have: block 0
// waits for blocks that start after it. Each must still read its own shared value afterwards.
extern "C" __global__ void wait_for_all(const float* x, float* y, unsigned* arrived) {
    __shared__ float mine[4];
    __shared__ int who;
    if (threadIdx.x < 4) mine[threadIdx.x] = x[blockIdx.x] + threadIdx.x;
    if (threadIdx.x == 0) who = blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(arrived, 1u);
        const volatile unsigned* seen = arrived;
        while (*seen < gridDim.x) __nanosleep(32);
    }
    __syncthreads();
    if (threadIdx.x < 4) y[who * 4 + threadIdx.x] = mine[threadIdx.x] + (float)(*arrived);
}
"""


def test_blocks_that_spin_wait_on_later_blocks_run_beside_them_each_with_its_own_shared_memory():
    x = np.arange(6, dtype=np.float32) * 10
    _, [[_, y, arrived]] = run(kernel("wait_for_all", WAIT_FOR_LATER_BLOCKS, (6,), (64,), inputs=("x",),
                                      outputs=("y", "arrived")),
                               (x, np.zeros(24, np.float32), np.zeros(1, np.uint32)), timeout_s=30)
    assert arrived[0] == 6
    np.testing.assert_array_equal(y.reshape(6, 4), x[:, None] + np.arange(4) + 6)


def test_blocks_that_all_spin_forever_are_a_deadlock_said_at_once():
    t0 = time.monotonic()
    source = WAIT_FOR_LATER_BLOCKS.replace("< gridDim.x", "< gridDim.x + 1")   # one more than ever arrives
    with pytest.raises(ExecutionError) as info:
        run(kernel("wait_for_all", source, (6,), (64,), inputs=("x",), outputs=("y", "arrived")),
            (np.zeros(6, np.float32), np.zeros(24, np.float32), np.zeros(1, np.uint32)), timeout_s=30)
    assert info.value.check == "hang" and "every running block spin-waits on another" in str(info.value)
    assert time.monotonic() - t0 < 15


def test_too_much_work_is_unsupported_before_anything_is_compiled():
    ks = kernel("softmax_rows", SOFTMAX.replace("300", "3000"), (65536,), (1024,), shared_bytes=3000 * 4)
    calls = [[guarded(np.zeros(4, np.float32), GUARD), guarded(np.zeros(4, np.float32), GUARD)]] * 4
    t0 = time.monotonic()
    with pytest.raises(ExecutionError) as info:
        CPU.run(ks, calls, guard=GUARD)
    assert info.value.check == "unsupported"
    assert str(info.value) == ("softmax_rows: too much work to emulate on the CPU: 65536 blocks x 1024 threads "
                               "x 4 calls; it is checked on a GPU")
    assert time.monotonic() - t0 < 0.5


def test_a_region_sized_softmax_runs_in_seconds():
    # 1024 rows of 1024, one 128-thread block a row, the gate's 4 calls: 4096 blocks, each 128 threads
    # meeting at 3 barriers and 26 shuffles (an OS thread per CUDA thread took about 90 s)
    x = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(4))
    ks = kernel("softmax_rows", SOFTMAX.replace("#define COLS 300", "#define COLS 1024"), (1024,), (128,),
                shared_bytes=1024 * 4)
    build(ks)
    t0 = time.monotonic()
    _, results = run(ks, *[(x.numpy(), np.zeros((1024, 1024), np.float32))] * 4)
    assert time.monotonic() - t0 < 8
    for _, y in results:
        torch.testing.assert_close(torch.from_numpy(y.copy()), torch.softmax(x, dim=1), atol=1e-5, rtol=1e-5)


ORDER = r"""
extern "C" __global__ void arrival(const float* x, int* order, int* counter) {
    const int me = blockIdx.x * blockDim.x + threadIdx.x;
    order[atomicAdd(counter, 1)] = me;
    SYNC
    order[atomicAdd(counter, 1)] = me;   // the second arrivals: after the barrier, when there is one
}
"""


@pytest.mark.parametrize("sync", ["", "__syncthreads();"])
def test_threads_run_in_one_order_every_time(sync):
    ks = kernel("arrival", ORDER.replace("SYNC", sync), (3,), (64,), inputs=["x"], outputs=["order", "counter"])
    call = (np.zeros(1, np.float32), np.full(384, -1, np.int32), np.zeros(1, np.int32))
    orders = [run(ks, call)[1][0][1] for _ in range(2)]
    np.testing.assert_array_equal(orders[0], orders[1])
    threads = np.arange(192).reshape(3, 64)
    by_block = orders[0].reshape(3, 128)                 # blocks one after another, each thread twice
    if sync:     # every thread reaches the barrier in thread order, then they all go on
        np.testing.assert_array_equal(by_block[:, :64], threads)
        np.testing.assert_array_equal(np.sort(by_block[:, 64:]), threads)
    else:        # a plain loop: each thread runs to its end before the next starts
        np.testing.assert_array_equal(by_block, threads.repeat(2, axis=1))


OVERFLOW = r"""
extern "C" __global__ void big_frame(const float* x, float* y) {
    __shared__ float s;
    volatile float local[200000];            // 800 KB of local memory: more than a GPU thread may have
    for (int i = 0; i < 200000; i += 4096) local[i] = x[0];
    s = local[threadIdx.x];
    y[threadIdx.x] = s;
}
"""


def test_local_arrays_bigger_than_a_threads_stack_crash_and_say_so():
    with pytest.raises(ExecutionError) as info:
        run(kernel("big_frame", OVERFLOW, (1,), (32,)), (np.ones(1, np.float32), np.zeros(32, np.float32)))
    err = str(info.value)
    assert info.value.check == "fault" and "SIGSEGV in thread (0, 0, 0) of block (0, 0, 0)" in err
    assert "overflowed its 512 KiB stack" in err


def test_the_portable_context_switch_runs_the_same_kernels(monkeypatch):
    # machines other than x86-64 switch fibers with ucontext; force it here to keep that path honest
    from agent_core.writer import emulate
    monkeypatch.setattr(emulate, "FLAGS", emulate.FLAGS + ("-DSTITCH_EMU_UCONTEXT",))
    test_block_softmax_with_shared_memory_barriers_and_shuffles_matches_torch()
    test_threads_that_return_before_a_barrier_do_not_deadlock_the_others()
    test_warp_scan_and_ballot_on_a_partial_warp()


WILD = r"""
extern "C" __global__ void wild(const float* x, float* y) {
    if (threadIdx.x == 0) y[(1ull << 40) + blockIdx.x] = x[0];
}
"""


def test_a_wild_write_is_a_fault_with_the_signal():
    calls = [(np.ones(4, np.float32), np.zeros(4, np.float32))] * 2
    with pytest.raises(ExecutionError) as info:
        run(kernel("wild", WILD, (1,), (32,)), *calls)
    err = info.value
    assert err.check == "fault" and "SIGSEGV" in str(err) and "call 1 of 2" in str(err)
    assert isinstance(err, WriterError) and isinstance(err, StitchError)


def test_inline_asm_is_unsupported_and_named_before_compiling():
    src = ('extern "C" __global__ void fenced(const float* x, float* y) {\n'
           '    // a comment that says asm is not what is found\n'
           '    asm volatile("membar.gl;");\n    y[0] = x[0];\n}\n')
    with pytest.raises(ExecutionError) as info:
        build(kernel("fenced", src, (1,), (32,)))
    assert info.value.check == "unsupported"
    assert "inline asm" in str(info.value) and "line 3" in str(info.value)


@pytest.mark.parametrize("source, says", [
    ('#include <cooperative_groups.h>\nextern "C" __global__ void k(float* y) { y[0] = 1; }\n',
     "cooperative_groups"),
    ('extern "C" __global__ void k(const __nv_bfloat16* x, float* y) { y[0] = 1; }\n', "bfloat16"),
])
def test_other_constructs_the_shim_cannot_run_are_named(source, says):
    with pytest.raises(ExecutionError) as info:
        build(kernel("k", source, (1,), (32,)))
    assert info.value.check == "unsupported" and says in str(info.value)


def test_what_g_plus_plus_rejects_is_unsupported_with_its_first_error_line():
    src = 'extern "C" __global__ void odd(const float* x, float* y) {\n    y[0] = __no_such_intrinsic(x[0]);\n}\n'
    with pytest.raises(ExecutionError) as info:
        build(kernel("odd", src, (1,), (32,)))
    assert info.value.check == "unsupported"
    assert "odd.cu:2" in str(info.value) and "__no_such_intrinsic" in str(info.value)


def test_a_non_pointer_parameter_is_unsupported():
    src = 'extern "C" __global__ void sized(const float* x, float* y, int n) { y[0] = x[0] * n; }\n'
    with pytest.raises(ExecutionError) as info:
        build(kernel("sized", src, (1,), (32,)))
    assert info.value.check == "unsupported" and "device pointer" in str(info.value)


def test_executables_are_cached_and_the_default_executor_without_a_gpu_is_the_emulator():
    ks = kernel("axpb", POINTWISE, (3,), (128,))
    first = build(ks)
    stamp = first.stat().st_mtime_ns
    t0 = time.monotonic()
    assert build(ks) == first and first.stat().st_mtime_ns == stamp
    assert time.monotonic() - t0 < 0.5
    assert default_executor(gpu=False).name == "cpu"


def test_the_gpu_child_reports_nvrtc_errors_with_their_line():
    # the GPU executor's child compiles before it touches a device, so this runs anywhere NVRTC does
    from agent_core.writer.gpu_exec import GpuExecutor
    src = 'extern "C" __global__ void typo(const float* x, float* y) {\n    y[0] = nope(x[0]);\n}\n'
    ks = kernel("typo", src, (1,), (32,))
    with pytest.raises(ExecutionError) as info:
        GpuExecutor().run(ks, [[guarded(np.ones(1, np.float32), GUARD), guarded(np.zeros(1, np.float32), GUARD)]],
                          guard=GUARD)
    assert info.value.check == "compile" and "line 2" in str(info.value) and "nope" in str(info.value)
