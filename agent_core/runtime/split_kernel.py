"""Split TF32 parts of a CUDA tensor in one kernel: read x once, write hi and lo (and a second hi).

split_tf32._split_ops makes the parts with torch ops (integer adds and masks, a subtraction, and
the fix-ups for NaN, infinities and values that round past the largest float), and the
channel-concatenated form adds a copy: a dozen launches and more passes over the activation, for every
split-TF32 matmul or convolution call. This kernel does the same bit operations, so its parts are bit
for bit those of the torch ops, in one launch and three passes (one read, two writes; four with the
copy).

The source is read in memory order as rows of `block` elements; row o of each part starts at
o * stride of its pointer. A plain split is one row (block = stride = n); [hi, lo, hi] concatenated
along a dim is rows of the elements from that dim inward, `stride` = 3 * block apart, each part at its
own offset. float4 loads and stores when every row and pointer allows them, 32-bit indices when the
parts fit. A contiguous activation whose concatenated parts are wanted in channels-last memory (the
channels-last form of a convolution after a generated kernel, which writes contiguous outputs) goes
through a second kernel that transposes 32 x 32 tiles in shared memory on the way.

Like every generated kernel it is used only once it has matched on this GPU: `ready()` checks its
parts against the torch ops' bit for bit on a few layouts at first use (never inside a CUDA graph
capture) and, if they differ or it cannot load, warns once and leaves splitting to the torch ops.
"""
from __future__ import annotations

import warnings
from functools import lru_cache

_checked: dict[str, bool] = {}   # arch -> whether the kernel matched the torch ops on this GPU

SOURCE = r"""
// bits + 0x1000, then the 13 low bits cleared: rounded to TF32's 10-bit mantissa. Three cases the
// add alone gets wrong: a NaN (GPU arithmetic makes 0x7FFFFFFF, whose all-ones mantissa would carry
// into the sign: -0) becomes the quiet NaN 0x7FFFFFFF, which stays NaN as TF32; an infinity stays as
// it is; a finite value the rounding would carry past the largest float is truncated instead.
__device__ __forceinline__ float tf32(float x) {
  const unsigned u = __float_as_uint(x), r = (u + 0x1000u) & 0xFFFFE000u;
  if ((u & 0x7F800000u) == 0x7F800000u) return (u & 0x7FFFFFu) ? __uint_as_float(0x7FFFFFFFu) : x;
  return __uint_as_float((r & 0x7F800000u) == 0x7F800000u ? u & 0xFFFFE000u : r);
}
// the remainder x - hi, as TF32: 0 where x is infinite or NaN (hi alone carries it)
__device__ __forceinline__ float tf32_rest(float x, float h) {
  return (__float_as_uint(x) & 0x7F800000u) == 0x7F800000u ? 0.0f : tf32(x - h);
}
__device__ __forceinline__ float4 tf32(float4 v) { return make_float4(tf32(v.x), tf32(v.y), tf32(v.z), tf32(v.w)); }
__device__ __forceinline__ float4 tf32_rest(float4 x, float4 h) {
  return make_float4(tf32_rest(x.x, h.x), tf32_rest(x.y, h.y), tf32_rest(x.z, h.z), tf32_rest(x.w, h.w));
}

// element i of x (memory order) is row i / block: it goes to i + row * (stride - block) of each part
template <typename T, typename I>
__device__ __forceinline__ void split_rows(const T* __restrict__ x, T* __restrict__ hi, T* __restrict__ lo,
                                           T* __restrict__ hi2, I n, I block, I stride) {
  const I step = (I)gridDim.x * blockDim.x;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const I d = i + i / block * (stride - block);
    const T v = x[i];
    const T h = tf32(v);
    hi[d] = h;
    lo[d] = tf32_rest(v, h);
    if (hi2) hi2[d] = h;
  }
}

// n, block and stride count floats (split_tf32_1_*) or float4s (split_tf32_4_*); hi2 may be null
#define SPLIT_KERNEL(NAME, T, I)                                                                      \
extern "C" __global__ void NAME(const T* __restrict__ x, T* __restrict__ hi, T* __restrict__ lo,     \
                                T* __restrict__ hi2, long long n, long long block, long long stride) { \
  split_rows<T, I>(x, hi, lo, hi2, (I)n, (I)block, (I)stride);                                        \
}
SPLIT_KERNEL(split_tf32_1_u32, float, unsigned)
SPLIT_KERNEL(split_tf32_1_u64, float, unsigned long long)
SPLIT_KERNEL(split_tf32_4_u32, float4, unsigned)
SPLIT_KERNEL(split_tf32_4_u64, float4, unsigned long long)

// x is [N][C][S] (a contiguous activation, S its spatial size) in groups of G channels; element
// (n, c, s) goes to (n * S + s) * stride + c + 2 * G * (c / G) of each part (a group's three parts side
// by side; one group: just c): channels-last parts straight from a contiguous input. 32 x 32 tiles pass
// through shared memory, so the reads (along s) and the writes (along c) are both coalesced.
template <typename I>
__device__ __forceinline__ void split_to_channels_last(const float* __restrict__ x, float* __restrict__ hi,
                                                       float* __restrict__ lo, float* __restrict__ hi2,
                                                       I C, I S, I stride, I G) {
  __shared__ float tile[32][33];   // 33: the transposed reads fall in 32 different banks
  const I n = blockIdx.z, s0 = (I)blockIdx.x * 32, c0 = (I)blockIdx.y * 32;
  const float* xn = x + n * C * S;
  for (unsigned k = threadIdx.y; k < 32; k += blockDim.y) {
    const I c = c0 + k, s = s0 + threadIdx.x;
    if (c < C && s < S) tile[k][threadIdx.x] = xn[c * S + s];
  }
  __syncthreads();
  for (unsigned k = threadIdx.y; k < 32; k += blockDim.y) {
    const I s = s0 + k, c = c0 + threadIdx.x;
    if (c < C && s < S) {
      const float v = tile[threadIdx.x][k];
      const float h = tf32(v);
      const I d = (n * S + s) * stride + c + 2 * G * (c / G);
      hi[d] = h;
      lo[d] = tf32_rest(v, h);
      if (hi2) hi2[d] = h;
    }
  }
}

#define TRANSPOSING_KERNEL(NAME, I)                                                                    \
extern "C" __global__ void NAME(const float* __restrict__ x, float* __restrict__ hi, float* __restrict__ lo, \
                                float* __restrict__ hi2, long long C, long long S, long long stride,     \
                                long long G) {                                                           \
  split_to_channels_last<I>(x, hi, lo, hi2, (I)C, (I)S, (I)stride, (I)G);                              \
}
TRANSPOSING_KERNEL(split_tf32_cl_u32, unsigned)
TRANSPOSING_KERNEL(split_tf32_cl_u64, unsigned long long)
"""
KERNELS = ("split_tf32_1_u32", "split_tf32_1_u64", "split_tf32_4_u32", "split_tf32_4_u64",
           "split_tf32_cl_u32", "split_tf32_cl_u64")
GRID_YZ = 65535                   # the most blocks a grid's y and z may have
THREADS = 256
MAX_BLOCKS = 132 * 16     # grid-stride beyond a few waves of the H200's 132 SMs


def entry(n: int, block: int, stride: int, pointers) -> tuple[str, int, int, int]:
    """(kernel name, n, block, stride in the kernel's units): float4 when every count is a multiple
    of 4 and every pointer 16-byte aligned; 32-bit indices when every index the kernel forms fits."""
    width = 4 if n % 4 == 0 and block % 4 == 0 and stride % 4 == 0 and all(p % 16 == 0 for p in pointers) else 1
    n, block, stride = n // width, block // width, stride // width
    # the largest index formed: the last row's end in a part, or i + one grid's step past n
    index = "u32" if -(-n // block) * stride + THREADS * MAX_BLOCKS < 2 ** 32 else "u64"
    return f"split_tf32_{width}_{index}", n, block, stride


@lru_cache(maxsize=None)
def _functions(arch: str):
    import cupy
    from ..compiler import compile_source
    module = cupy.RawModule(path=str(compile_source(SOURCE, "split_tf32", arch=arch).path))
    return module, {name: module.get_function(name) for name in KERNELS}


def launch(x, hi: int, lo: int, hi2: int, block: int, stride: int) -> None:
    """The parts of x (a CUDA float32 tensor, dense in memory order) to the device addresses hi, lo
    and hi2 (0: none), row o of `block` elements to o * stride floats past each."""
    n = x.numel()
    if n == 0:
        return
    name, units, block, stride = entry(n, block, stride, [x.data_ptr(), hi, lo] + ([hi2] if hi2 else []))
    blocks = max(1, min(MAX_BLOCKS, -(-units // THREADS)))
    _run(name, (blocks, 1, 1), (THREADS, 1, 1), [x.data_ptr(), hi, lo, hi2], (units, block, stride))


def transposed_entry(n: int, c: int, s: int, stride: int) -> tuple[str, tuple[int, int, int]] | None:
    """(kernel name, grid) of the channels-last split of an [n][c][s] input; None past the grid's limits."""
    grid = (-(-s // 32), -(-c // 32), n)
    if grid[1] > GRID_YZ or grid[2] > GRID_YZ:
        return None
    index = "u32" if n * s * stride < 2 ** 32 and n * c * s < 2 ** 32 else "u64"   # every offset formed
    return f"split_tf32_cl_{index}", grid


def launch_to_channels_last(x, hi: int, lo: int, hi2: int, stride: int, group: int | None = None) -> bool:
    """The parts of x (contiguous CUDA float32, [N, C, spatial...]) to the addresses hi, lo and hi2
    (0: none) in channels-last order, element (n, c, s) to (n * S + s) * stride + c floats past each,
    and 2 * group more for each group of `group` channels before c (default one group: C); False
    (nothing launched) when the grid cannot cover x."""
    import math
    n, c, s = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    if x.numel() == 0:
        return True
    chosen = transposed_entry(n, c, s, stride)
    if chosen is None:
        return False
    name, grid = chosen
    _run(name, grid, (32, 8, 1), [x.data_ptr(), hi, lo, hi2], (c, s, stride, group or c))
    return True


def _run(name: str, grid, block, pointers, counts) -> None:
    """Launch kernel `name` on torch's current stream (CUDA graphs capture it)."""
    import cupy

    from ..compiler import default_arch
    from .launch import cupy_stream
    _, functions = _functions(default_arch())
    args = tuple(cupy.uint64(p) for p in pointers) + tuple(cupy.int64(v) for v in counts)
    with cupy_stream():
        functions[name](tuple(grid), tuple(block), args)


def ready(reference) -> bool:
    """Whether to split with this kernel: it loads and, on its first use in this process, gives the
    parts reference(x, hi, lo) and reference-made concatenations give (the torch ops) on a plain and a
    float4 split and a concatenated one. False, with the torch ops doing the split, while a CUDA graph
    is being captured before that check has run."""
    import torch
    from ..compiler import default_arch
    arch = default_arch()
    if arch not in _checked:
        if torch.cuda.is_current_stream_capturing():
            return False
        _checked[arch] = _matches(reference)
    return _checked[arch]


def special_values():
    """Bits the rounding must treat with care: inf, -0, a value that rounds past the largest float,
    a subnormal, a GPU's NaN (all-ones mantissa) and a NaN with only low mantissa bits."""
    import torch
    return torch.tensor([0x7F800000, -0x80000000, 0x7F7FF000, 0x00001000, 0x7FFFFFFF, 0x7F800001], dtype=torch.int32)


def _matches(reference) -> bool:
    import torch
    special = special_values()
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        for shape, rows in (((3, 333), None), ((4, 1024), None), ((2, 3, 5, 5), 75), ((2, 40, 6, 7), 1680)):
            x = torch.randn(shape, device="cuda", generator=g) * 1e3
            x.view(-1)[:6] = special.to("cuda").view(torch.float32)
            want_hi, want_lo = torch.empty_like(x), torch.empty_like(x)
            reference(x, want_hi, want_lo)
            if rows is None:
                hi, lo = torch.empty_like(x), torch.empty_like(x)
                launch(x, hi.data_ptr(), lo.data_ptr(), 0, x.numel(), x.numel())
                got, want = (hi, lo), (want_hi, want_lo)
            else:     # [hi, lo, hi] along dim 1
                dst = torch.empty(shape[0], 3 * shape[1], *shape[2:], device="cuda")
                launch(x, dst.data_ptr(), dst.data_ptr() + 4 * rows, dst.data_ptr() + 8 * rows, rows, 3 * rows)
                got, want = (dst,), (torch.cat([want_hi, want_lo, want_hi], dim=1),)
            if rows == 1680:    # in channels-last memory, transposed (2 x 2 tiles a sample), in 5 groups of 8
                cl = torch.empty(shape[0], 3 * shape[1], *shape[2:], device="cuda", memory_format=torch.channels_last)
                launch_to_channels_last(x, cl.data_ptr(), cl.data_ptr() + 4 * 8, cl.data_ptr() + 8 * 8, 3 * shape[1], 8)
                grouped = torch.cat([torch.cat([h, lo_, h], 1) for h, lo_ in zip(want_hi.split(8, 1), want_lo.split(8, 1))], 1)
                got, want = got + (cl,), want + (grouped,)
            if not all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(got, want)):
                warnings.warn(f"the split TF32 kernel's parts differ from the torch ops' on {tuple(shape)}: "
                              "split TF32 keeps the torch ops", RuntimeWarning, stacklevel=3)
                return False
        return True
    except Exception as exc:   # no CuPy, a compile or load error: the torch ops still split
        first = (str(exc).strip().splitlines() or [""])[0]
        warnings.warn(f"the split TF32 kernel cannot run ({type(exc).__name__}: {first[:200]}): split TF32 "
                      "keeps the torch ops", RuntimeWarning, stacklevel=3)
        return False
