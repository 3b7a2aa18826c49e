"""The tensor-core helpers of attention_mma.HELPERS written in plain C++ (no inline asm, no cp.async),
with the same names and signatures, so a kernel body written against them runs in the CPU emulator
(writer/emulate.py) unchanged: its fragment layouts, index arithmetic, pipeline and epilogue are then
checked against torch on a machine without a GPU.

mma_tf32 gathers the m16n8k8 operands with warp shuffles from the lanes that hold them in the
hardware's fragment layout (lane 4 g + t: A[g][t], A[g + 8][t], A[g][t + 4], A[g + 8][t + 4];
B[t][g], B[t + 4][g]; C[g][2t], C[g][2t + 1], C[g + 8][2t], C[g + 8][2t + 1]) and reads each operand
as TF32 the way the tensor cores do (the low 13 bits ignored), so the split's numerics are emulated
too. The copies are plain loads and stores: they complete at once, so commit and wait do nothing.
"""
from __future__ import annotations

PORTABLE_HELPERS = r"""
// hi: x rounded to TF32 (the low 13 bits are ignored where it is read), lo: the exact remainder x - hi
__device__ __forceinline__ void split_tf32(float x, unsigned& hi, unsigned& lo) {
  const unsigned h = __float_as_uint(x) + 0x1000u;
  hi = h;
  lo = __float_as_uint(x - __uint_as_float(h & 0xffffe000u));
}
// an operand as the tensor cores read it: its low 13 bits dropped
__device__ __forceinline__ float tf32_value(unsigned x) { return __uint_as_float(x & 0xffffe000u); }
// c += a * b for one m16n8k8 tile in the hardware's fragment layout, operands gathered by shuffles
__device__ __forceinline__ void mma_tf32(float* c, const unsigned* a, const unsigned* b) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int k = 0; k < 8; ++k) {
    const int from_a = g * 4 + (k & 3);
    const float a_g = tf32_value(__shfl_sync(0xffffffffu, k < 4 ? a[0] : a[2], from_a));
    const float a_g8 = tf32_value(__shfl_sync(0xffffffffu, k < 4 ? a[1] : a[3], from_a));
    const float b0 = tf32_value(__shfl_sync(0xffffffffu, k < 4 ? b[0] : b[1], (2 * t) * 4 + (k & 3)));
    const float b1 = tf32_value(__shfl_sync(0xffffffffu, k < 4 ? b[0] : b[1], (2 * t + 1) * 4 + (k & 3)));
    c[0] += a_g * b0;
    c[1] += a_g * b1;
    c[2] += a_g8 * b0;
    c[3] += a_g8 * b1;
  }
}
// c += (a_hi + a_lo)(b_hi + b_lo) without the lo * lo term: small terms first
__device__ __forceinline__ void mma_3xtf32(float* c, const unsigned* ah, const unsigned* al,
                                           const unsigned* bh, const unsigned* bl) {
  mma_tf32(c, al, bh);
  mma_tf32(c, ah, bl);
  mma_tf32(c, ah, bh);
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool ok) {
  *reinterpret_cast<float4*>(dst) = ok ? *reinterpret_cast<const float4*>(src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool ok) { *dst = ok ? *src : 0.0f; }
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}
"""
