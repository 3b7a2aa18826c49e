"""The one-kernel TF32 split (runtime/split_kernel.py) on the CPU: its source built by NVRTC for sm_90,
and its loop run by the CPU emulator (agent_core.writer.emulate) on every layout split_tf32 hands it,
bit for bit against the torch ops it replaces (split_tf32.split_into on CPU tensors)."""
import numpy as np
import pytest
import torch

from agent_core.codegen.kernel import KernelSource
from agent_core.compiler import compile_source
from agent_core.runtime import split_kernel as sk
from agent_core.runtime import split_tf32 as st
from agent_core.writer.emulate import CpuExecutor
from agent_core.writer.executors import CANARY, guarded, payload

GUARD = 256


def test_the_source_builds_for_sm90_with_every_entry_point():
    built = compile_source(sk.SOURCE, "split_tf32", arch="sm_90", use_cache=False)
    for name in sk.KERNELS:
        assert name.encode() in built.cubin


@pytest.mark.parametrize("n,block,stride,ptrs,want", [
    (4096, 4096, 4096, [0, 256, 512], ("split_tf32_4_u32", 1024, 1024, 1024)),
    (4098, 4098, 4098, [0, 256, 512], ("split_tf32_1_u32", 4098, 4098, 4098)),       # n not a multiple of 4
    (4096, 4096, 4096, [0, 260, 512], ("split_tf32_1_u32", 4096, 4096, 4096)),       # a part off 16 bytes
    (12, 6, 18, [0, 256, 512, 768], ("split_tf32_1_u32", 12, 6, 18)),                # rows of 6
    (2 ** 31, 2 ** 31, 2 ** 31, [0, 256, 512], ("split_tf32_4_u32", 2 ** 29, 2 ** 29, 2 ** 29)),
    (2 ** 31, 2 ** 30, 3 * 2 ** 30, [0, 256, 512, 768], ("split_tf32_4_u32", 2 ** 29, 2 ** 28, 3 * 2 ** 28)),
    (2 ** 31, 2 ** 30, 3 * 2 ** 30, [0, 260, 512, 768], ("split_tf32_1_u64", 2 ** 31, 2 ** 30, 3 * 2 ** 30)),
])
def test_the_entry_point_takes_float4s_and_32_bit_indices_only_where_they_are_safe(n, block, stride, ptrs, want):
    assert sk.entry(n, block, stride, ptrs) == want


def values(shape, seed):
    """Normal draws over 40 decades, with the values the rounding is delicate for."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.empty(shape).uniform_(-45, 45, generator=g))
    flat = x.view(-1)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.4e38, -3.4e38, 1e-40, -1e-45,
                            1.0, -1.5])
    flat[:len(special)] = special
    ties = torch.tensor([0x3F801000, 0x3F803000, 0x7F7FF000, 0x00001000], dtype=torch.int32).view(torch.float32)
    flat[len(special):len(special) + len(ties)] = ties     # exactly half a TF32 step above a TF32 value
    odd = sk.special_values().view(torch.float32)          # a GPU's NaN, a NaN with low bits only, ...
    flat[-len(odd):] = odd
    return x


def emulate(x, units, block, stride, width, index, parts):
    """The kernel's loop over x (memory order) run by the emulator: `parts` is (lo_at, count of floats
    in the destination) or None for a plain split into two buffers; the buffers after it ran."""
    t = "float4" if width == 4 else "float"
    i = "unsigned" if index == "u32" else "unsigned long long"
    if parts is None:
        args, call = "float* hi, float* lo", "(T*)hi, (T*)lo, (T*)0"
    else:
        lo_at, _ = parts
        args = "float* dst"
        part = lambda k: f"(T*)(dst + {k * block * width})"
        hi, hi2 = st._hi_at(lo_at)
        call = f"{part(hi)}, {part(lo_at)}, {part(hi2)}"
    source = sk.SOURCE + (f"typedef {t} T;\nextern \"C\" __global__ void split_case(const float* x, {args}) {{\n"
                          f"  split_rows<T, {i}>((const T*)x, {call}, ({i}){units}, ({i}){block}, ({i}){stride});\n}}\n")
    grid = min(sk.MAX_BLOCKS, 3)   # a few blocks: the grid-stride loop wraps many times
    ks = KernelSource(name="split_case", kind="writer", source=source, node_ids=[], inputs=["x"],
                      outputs=["hi", "lo"] if parts is None else ["dst"], grid=(grid, 1, 1), block=(64, 1, 1))
    flat = x.contiguous().view(-1).numpy() if not st.is_channels_last(x) else \
        x.permute(0, *range(2, x.dim()), 1).contiguous().view(-1).numpy()
    outs = [np.zeros(flat.size, np.float32) for _ in range(2)] if parts is None else [np.zeros(parts[1], np.float32)]
    calls = [[guarded(a, GUARD) for a in [flat, *outs]]]
    [after] = CpuExecutor().run(ks, calls, guard=GUARD, timeout_s=60)
    for b in after:   # nothing written outside a buffer
        assert (b[:GUARD] == CANARY).all() and (b[-GUARD:] == CANARY).all()
    return [payload(b, GUARD, np.float32, a.shape) for b, a in zip(after[1:], outs)]


def bits(a):
    return np.asarray(a, np.float32).view(np.int32)


@pytest.mark.parametrize("shape,seed", [((4, 1000), 0), ((7, 13), 1)], ids=["float4", "scalar"])
def test_a_plain_split_is_the_torch_ops_bit_for_bit(shape, seed):
    x = values(shape, seed)
    want_hi, want_lo = torch.empty_like(x), torch.empty_like(x)
    st.split_into(x, want_hi, want_lo)           # CPU tensors: the torch ops
    n = x.numel()
    name, units, block, stride = sk.entry(n, n, n, [0, 256, 512])
    width, index = int(name.split("_")[2]), name.split("_")[3]
    hi, lo = emulate(x, units, block, stride, width, index, None)
    np.testing.assert_array_equal(bits(hi), bits(want_hi.view(-1).numpy()))
    np.testing.assert_array_equal(bits(lo), bits(want_lo.view(-1).numpy()))


A, B = st.A_LO, st.B_LO
CAT_CASES = [   # (shape, dim, lo_at, channels-last, groups)
    ((2, 6, 5, 4), 1, A, False, 1),      # an activation's [lo, hi, hi] along its channels, rows of 120
    ((2, 3, 5, 5), 1, B, False, 1),      # a weight's [hi, lo, hi], rows of 75 (scalar)
    ((6, 4, 3, 3), 0, B, False, 1),      # a transposed convolution's weight along dim 0: one row
    ((2, 8, 3, 5), 1, A, True, 1),       # channels-last: rows of the 8 channels (float4)
    ((2, 5, 2, 3, 2), 1, A, True, 1),    # channels-last 3-D: rows of 5 (scalar)
    ((2, 6, 4, 5), 1, A, False, 3),      # three groups: rows of a group's 2 channels x 20
    ((6, 4, 3, 3), 0, B, False, 2),      # a grouped transposed convolution's weight: rows of 3 x 36
    ((2, 12, 3, 3), 1, A, True, 3),      # channels-last, three groups: rows of 4 channels (float4)
    ((2, 6, 5, 4), 1, 2, False, 1),      # lo last ([hi, hi, lo]): any place works
]


@pytest.mark.parametrize("shape,dim,lo_at,channels_last,groups", CAT_CASES,
                         ids=[f"{c[0]}-g{c[4]}" for c in CAT_CASES])
def test_a_concatenated_split_is_the_torch_ops_bit_for_bit(shape, dim, lo_at, channels_last, groups):
    fmt = (torch.channels_last if len(shape) == 4 else torch.channels_last_3d) if channels_last \
        else torch.contiguous_format
    x = values(shape, 3).contiguous(memory_format=fmt)
    wide = list(shape)
    wide[dim] *= 3
    want = torch.empty(wide, memory_format=fmt)
    st.split_cat_into(x, want, dim, lo_at, groups)        # CPU tensors: the torch ops
    rows = st._cat_rows(x, want, dim, groups)
    assert rows == (shape[1] if channels_last else int(np.prod(shape[dim:]))) // groups
    name, units, block, stride = sk.entry(x.numel(), rows, 3 * rows, [0, 256, 512, 768])
    width, index = int(name.split("_")[2]), name.split("_")[3]
    assert width == (4 if rows % 4 == 0 else 1)
    [got] = emulate(x, units, block, stride, width, index, (lo_at, want.numel()))
    memory_order = want.permute(0, *range(2, want.dim()), 1) if channels_last else want
    np.testing.assert_array_equal(bits(got), bits(memory_order.contiguous().view(-1).numpy()))


def test_layouts_the_kernel_cannot_read_in_rows_keep_the_torch_ops():
    x = torch.randn(2, 4, 3, 3)
    assert st._cat_rows(x, torch.empty(2, 12, 3, 3, memory_format=torch.channels_last), 1) is None
    assert st._cat_rows(x.contiguous(memory_format=torch.channels_last), torch.empty(2, 12, 3, 3), 1) is None
    assert st._cat_rows(x.transpose(2, 3), torch.empty(2, 12, 3, 3), 1) is None


@pytest.mark.parametrize("shape,lo_at,groups", [((2, 40, 6, 7), A, 1), ((2, 3, 5, 5), A, 1), ((1, 33, 2, 2, 9), B, 1),
                                                ((2, 40, 6, 7), A, 5)],
                         ids=["2x2 tiles", "3 channels", "3-D", "5 groups"])
def test_a_contiguous_input_split_into_channels_last_parts_is_the_torch_ops_bit_for_bit(shape, lo_at, groups):
    x = values(shape, 5)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    wide = [shape[0], 3 * shape[1], *shape[2:]]
    want = torch.empty(wide, memory_format=fmt)
    st.split_cat_into(x, want, 1, lo_at, groups)   # CPU tensors: the torch ops, through strided views
    n, c, s = shape[0], shape[1], int(np.prod(shape[2:]))
    g = c // groups
    name, grid = sk.transposed_entry(n, c, s, 3 * c)
    assert name == "split_tf32_cl_u32" and grid == (-(-s // 32), -(-c // 32), n)
    part = lambda k: f"dst + {k * g}"
    hi, hi2 = st._hi_at(lo_at)
    source = sk.SOURCE + ("extern \"C\" __global__ void split_case(const float* x, float* dst) {\n"
                          f"  split_to_channels_last<unsigned>(x, {part(hi)}, {part(lo_at)}, {part(hi2)}, "
                          f"{c}u, {s}u, {3 * c}u, {g}u);\n}}\n")
    ks = KernelSource(name="split_case", kind="writer", source=source, node_ids=[], inputs=["x"], outputs=["dst"],
                      grid=grid, block=(32, 8, 1))
    out = np.zeros(want.numel(), np.float32)
    calls = [[guarded(a, GUARD) for a in (x.contiguous().view(-1).numpy(), out)]]
    [after] = CpuExecutor().run(ks, calls, guard=GUARD, timeout_s=60)
    assert all((b[:GUARD] == CANARY).all() and (b[-GUARD:] == CANARY).all() for b in after)
    got = payload(after[1], GUARD, np.float32, out.shape)
    np.testing.assert_array_equal(bits(got), bits(want.permute(0, *range(2, want.dim()), 1).contiguous().view(-1).numpy()))


def test_the_transposing_entry_widens_its_indices_and_refuses_grids_past_the_limits():
    assert sk.transposed_entry(8, 64, 56 * 56, 192)[0] == "split_tf32_cl_u32"
    assert sk.transposed_entry(4096, 512, 64 * 64, 1536)[0] == "split_tf32_cl_u64"
    assert sk.transposed_entry(70000, 4, 4, 12) is None                   # batch past grid z
    assert sk.transposed_entry(2, 32 * 65536, 4, 3 * 32 * 65536) is None  # channels past grid y


def test_infinities_and_nans_are_carried_by_hi_alone_and_no_finite_value_rounds_to_infinity():
    odd = sk.special_values().view(torch.float32)
    hi, lo = st.split_tf32(odd)          # the torch ops, which the kernel matches bit for bit
    h, low = bits(hi.numpy()), bits(lo.numpy())
    assert h[0] == 0x7F800000 and low[0] == 0                     # inf: inf + 0
    assert torch.isnan(hi[4:]).all() and (low[4:] == 0).all()    # both NaNs stay NaN...
    assert ((h[4:] & 0x7FFFE000) == 0x7FFFE000).all()             # ...when read as TF32 (top bits kept)
    assert torch.isfinite(hi[2]) and abs(float(hi[2]) + float(lo[2]) - float(odd[2])) < 2 ** -21 * float(odd[2])


def test_the_torch_ops_split_never_synchronises_so_a_cuda_graph_can_capture_it():
    """Where the kernel takes no layout (a transposed convolution's weight split into channels-last
    parts, per call inside the program's CUDA graph), the torch ops split it: none may read data back
    to the host. Indexing by a mask did (it counts the mask), and 45_UNetSoftmax's capture failed at
    that call on the H100. Same bits as the kernel's, and as that indexing gave, near the largest float."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))
    seen: set = set()
    top = torch.arange(0x7F7FE000, 0x7F800100, dtype=torch.int64).to(torch.int32)
    x = torch.cat([top, top | torch.tensor(-0x80000000, dtype=torch.int32), sk.special_values()]).view(torch.float32)
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    with Ops():
        st._split_ops(x, hi, lo)
    host = {"nonzero", "index", "index_put", "index_put_", "masked_select", "masked_scatter", "_local_scalar_dense",
            "item"}
    assert not seen & host, seen & host
    h, finite = bits(hi.numpy()), torch.isfinite(x)
    want = x.view(torch.int32).numpy() & np.int32(-0x2000)          # truncated where the rounding overflowed
    over = finite.numpy() & ~torch.isfinite(x.view(torch.int32).add(0x1000).bitwise_and(-0x2000).view(torch.float32)).numpy()
    assert over.sum() > 0 and (h[over] == want[over]).all()
    assert torch.isfinite(hi[finite]).all()                        # no finite value becomes an infinity
