// CUDA built-ins for g++, so a kernel proposed for the GPU runs on the CPU (agent_core/writer/emulate.py).
//
// Included two ways:
//  - `-include emulate_shim.h` before the kernel's translation unit: the qualifiers, vector types,
//    intrinsics, atomics, warp and block collectives a kernel calls (light headers only, so the
//    kernel's own typedefs and names meet as little as possible);
//  - compiled once with -DSTITCH_EMU_RUNTIME into the runtime object: the fibers (every CUDA thread of
//    a block is one, all on one OS thread, blocks in turn; a block that spin-waits with __nanosleep
//    yields, and the next block starts beside it), the barriers, the scheduler and the driver that
//    reads the argument buffers, runs every call in one process and writes the buffers back.
// What it cannot model: divergent warps whose lanes run different numbers of warp collectives
// (lanes meet by count); code that needs threads to run at the same time with no collective or
// __nanosleep between them (warp-synchronous code without __syncwarp, a spin-wait without a sleep: a
// fiber runs until its next collective, so such code computes something else or hangs); timing.
#ifndef STITCH_EMULATE_SHIM_H
#define STITCH_EMULATE_SHIM_H

#include <assert.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

// ---- qualifiers -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __inline__ inline
// __noinline__ is rewritten by emulate.py (libstdc++ headers use the name in their own attributes)
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
// emulate.py rewrites each `__shared__ T name[...];` into a reference to the running block's own
// copy (stitch_emu::block_static), and `extern __shared__ T a[]` into a pointer to the block's dynamic
// shared memory; a declaration it does not recognise stays one static per kernel function, which the
// blocks share (right while they run one after another)
#define __shared__ static

// ---- index types ------------------------------------------------------------------------------
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};
// plain globals: every CUDA thread runs as a fiber on one OS thread, and the scheduler sets them before
// it resumes one (collectives are calls into the runtime object, so a kernel reloads them after each)
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

// ---- vector types (CUDA's sizes and alignments) -----------------------------------------------
#define STITCH_VEC(T, N, A, ...) struct __attribute__((aligned(A))) T##N { __VA_ARGS__; };
#define STITCH_VECS(T, S)                                     \
    STITCH_VEC(T, 1, S, T x)                                  \
    STITCH_VEC(T, 2, 2 * S, T x, y)                           \
    struct T##3 { T x, y, z; };                               \
    STITCH_VEC(T, 4, (4 * S > 16 ? 16 : 4 * S), T x, y, z, w)
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef long long longlong;
typedef unsigned long long ulonglong;
STITCH_VECS(char, 1)
STITCH_VECS(uchar, 1)
STITCH_VECS(short, 2)
STITCH_VECS(ushort, 2)
STITCH_VECS(int, 4)
STITCH_VECS(float, 4)
struct __attribute__((aligned(8))) long1 { long x; };
struct __attribute__((aligned(16))) long2 { long x, y; };
struct __attribute__((aligned(8))) ulong1 { unsigned long x; };
struct __attribute__((aligned(16))) ulong2 { unsigned long x, y; };
struct __attribute__((aligned(8))) longlong1 { long long x; };
struct __attribute__((aligned(16))) longlong2 { long long x, y; };
struct __attribute__((aligned(8))) ulonglong1 { unsigned long long x; };
struct __attribute__((aligned(16))) ulonglong2 { unsigned long long x, y; };
struct __attribute__((aligned(8))) double1 { double x; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct double3 { double x, y, z; };
struct __attribute__((aligned(16))) double4 { double x, y, z, w; };
// uint1..uint4: uint3 is the index type above
struct __attribute__((aligned(4))) uint1 { unsigned x; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
#undef STITCH_VECS
#undef STITCH_VEC
#define STITCH_MAKE(T, S)                                                                          \
    inline T##1 make_##T##1(S x) { return {x}; }                                                   \
    inline T##2 make_##T##2(S x, S y) { return {x, y}; }                                           \
    inline T##3 make_##T##3(S x, S y, S z) { return {x, y, z}; }                                   \
    inline T##4 make_##T##4(S x, S y, S z, S w) { return {x, y, z, w}; }
STITCH_MAKE(char, signed char)
STITCH_MAKE(uchar, unsigned char)
STITCH_MAKE(short, short)
STITCH_MAKE(ushort, unsigned short)
STITCH_MAKE(int, int)
STITCH_MAKE(uint, unsigned)
STITCH_MAKE(float, float)
STITCH_MAKE(double, double)
#undef STITCH_MAKE
inline longlong2 make_longlong2(long long x, long long y) { return {x, y}; }
inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return {x, y}; }

// ---- the runtime's interface (defined under STITCH_EMU_RUNTIME) --------------------------------
namespace stitch_emu {
enum WarpOp { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, BALLOT, ANY, ALL, SYNC, REDUCE_ADD, REDUCE_MIN,
              REDUCE_MAX, REDUCE_AND, REDUCE_OR, REDUCE_XOR, MATCH_ANY, ACTIVE };
enum BlockOp { BLOCK_SYNC, BLOCK_COUNT, BLOCK_AND, BLOCK_OR };
constexpr unsigned MAX_DYNAMIC_SHARED = 232448;   // 227 KiB, what an H100/H200 block may ask for
constexpr unsigned MAX_STATIC_SHARED = 49152;     // 48 KiB, CUDA's limit on a block's static shared memory
// the running block's copy of the __shared__ declaration `key` stands for (bytes, alignment), and its
// dynamic shared memory
void* block_static(const void* key, unsigned long size, unsigned long align);
void* block_dynamic();
int block_sync(int predicate, int op);
// __nanosleep in a spin-wait: this thread yields, so other threads and blocks run before it looks again
void spin();
// every lane of `mask` that has not returned publishes `value`, then each reads what `op` says
unsigned long long warp_op(unsigned mask, unsigned long long value, int op, int arg, int width);
using Thunk = void (*)(void* const* args);
// collectives: whether the kernel's source names a barrier, warp collective or shared memory (emulate.py);
// without, each block's threads run as a plain loop
int driver_main(int argc, char** argv, int nparams, Thunk thunk, bool collectives);

template <class T> inline unsigned long long bits_of(T v) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "warp shuffles move 4- or 8-byte values");
    unsigned long long b = 0;
    __builtin_memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> inline T from_bits(unsigned long long b) {
    T v;
    __builtin_memcpy(&v, &b, sizeof(T));
    return v;
}
// read-modify-write by compare-and-swap: any 4- or 8-byte type (floats included)
template <class T, class F> inline T cas_loop(T* address, F update) {
    T old = *address, next;
    do {
        next = update(old);
    } while (!__atomic_compare_exchange(address, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old;
}
}  // namespace stitch_emu

// ---- block and warp collectives ---------------------------------------------------------------
inline void __syncthreads() { stitch_emu::block_sync(0, stitch_emu::BLOCK_SYNC); }
inline int __syncthreads_count(int p) { return stitch_emu::block_sync(p, stitch_emu::BLOCK_COUNT); }
inline int __syncthreads_and(int p) { return stitch_emu::block_sync(p, stitch_emu::BLOCK_AND); }
inline int __syncthreads_or(int p) { return stitch_emu::block_sync(p, stitch_emu::BLOCK_OR); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { stitch_emu::warp_op(mask, 0, stitch_emu::SYNC, 0, 32); }
inline unsigned __activemask() { return (unsigned)stitch_emu::warp_op(0, 0, stitch_emu::ACTIVE, 0, 32); }

#define STITCH_SHFL(NAME, OP, ARG)                                                                 \
    template <class T> inline T NAME(unsigned mask, T var, ARG arg, int width = warpSize) {        \
        return stitch_emu::from_bits<T>(                                                           \
            stitch_emu::warp_op(mask, stitch_emu::bits_of(var), stitch_emu::OP, (int)arg, width)); \
    }
STITCH_SHFL(__shfl_sync, SHFL_IDX, int)
STITCH_SHFL(__shfl_up_sync, SHFL_UP, unsigned)
STITCH_SHFL(__shfl_down_sync, SHFL_DOWN, unsigned)
STITCH_SHFL(__shfl_xor_sync, SHFL_XOR, int)
#undef STITCH_SHFL
inline unsigned __ballot_sync(unsigned mask, int p) {
    return (unsigned)stitch_emu::warp_op(mask, p != 0, stitch_emu::BALLOT, 0, 32);
}
inline int __any_sync(unsigned mask, int p) { return (int)stitch_emu::warp_op(mask, p != 0, stitch_emu::ANY, 0, 32); }
inline int __all_sync(unsigned mask, int p) { return (int)stitch_emu::warp_op(mask, p != 0, stitch_emu::ALL, 0, 32); }
inline int __uni_sync(unsigned mask, int p) {
    unsigned b = __ballot_sync(mask, p);
    return b == 0 || b == (mask & __activemask());
}
#define STITCH_REDUCE(NAME, OP, T, SIGNED)                                                          \
    inline T NAME(unsigned mask, T v) {                                                             \
        return (T)stitch_emu::warp_op(mask, (unsigned long long)(unsigned)v, stitch_emu::OP, SIGNED, 32); \
    }
STITCH_REDUCE(__reduce_add_sync, REDUCE_ADD, unsigned, 0)
STITCH_REDUCE(__reduce_add_sync, REDUCE_ADD, int, 1)
STITCH_REDUCE(__reduce_min_sync, REDUCE_MIN, unsigned, 0)
STITCH_REDUCE(__reduce_min_sync, REDUCE_MIN, int, 1)
STITCH_REDUCE(__reduce_max_sync, REDUCE_MAX, unsigned, 0)
STITCH_REDUCE(__reduce_max_sync, REDUCE_MAX, int, 1)
STITCH_REDUCE(__reduce_and_sync, REDUCE_AND, unsigned, 0)
STITCH_REDUCE(__reduce_or_sync, REDUCE_OR, unsigned, 0)
STITCH_REDUCE(__reduce_xor_sync, REDUCE_XOR, unsigned, 0)
#undef STITCH_REDUCE
template <class T> inline unsigned __match_any_sync(unsigned mask, T v) {
    return (unsigned)stitch_emu::warp_op(mask, stitch_emu::bits_of(v), stitch_emu::MATCH_ANY, 0, 32);
}
template <class T> inline unsigned __match_all_sync(unsigned mask, T v, int* pred) {
    unsigned same = __match_any_sync(mask, v), all = mask & __activemask();
    *pred = same == all;
    return same == all ? all : 0;
}

// ---- memory: fences, cached loads and stores, atomics ----------------------------------------
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#define STITCH_LOAD(NAME) template <class T> inline T NAME(const T* p) { return *p; }
STITCH_LOAD(__ldg)
STITCH_LOAD(__ldca)
STITCH_LOAD(__ldcg)
STITCH_LOAD(__ldcs)
STITCH_LOAD(__ldlu)
STITCH_LOAD(__ldcv)
#undef STITCH_LOAD
#define STITCH_STORE(NAME) template <class T> inline void NAME(T* p, T v) { *p = v; }
STITCH_STORE(__stwb)
STITCH_STORE(__stcg)
STITCH_STORE(__stcs)
STITCH_STORE(__stwt)
#undef STITCH_STORE

#define STITCH_ATOMIC_ARITH(T)                                                                          \
    inline T atomicAdd(T* a, T v) { return stitch_emu::cas_loop(a, [v](T o) { return (T)(o + v); }); } \
    inline T atomicSub(T* a, T v) { return stitch_emu::cas_loop(a, [v](T o) { return (T)(o - v); }); } \
    inline T atomicMax(T* a, T v) { return stitch_emu::cas_loop(a, [v](T o) { return o < v ? v : o; }); } \
    inline T atomicMin(T* a, T v) { return stitch_emu::cas_loop(a, [v](T o) { return v < o ? v : o; }); } \
    inline T atomicExch(T* a, T v) { T old; __atomic_exchange(a, &v, &old, __ATOMIC_SEQ_CST); return old; }
#define STITCH_ATOMIC_INT(T)                                                                                 \
    STITCH_ATOMIC_ARITH(T)                                                                                   \
    inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }                       \
    inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }                     \
    inline T atomicCAS(T* a, T compare, T v) {                                                               \
        __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
        return compare;                                                                                      \
    }
STITCH_ATOMIC_INT(int)
STITCH_ATOMIC_INT(unsigned)
STITCH_ATOMIC_INT(long long)
STITCH_ATOMIC_INT(unsigned long long)
STITCH_ATOMIC_ARITH(float)
STITCH_ATOMIC_ARITH(double)
#undef STITCH_ATOMIC_INT
#undef STITCH_ATOMIC_ARITH
inline unsigned atomicInc(unsigned* a, unsigned limit) {
    return stitch_emu::cas_loop(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
    return stitch_emu::cas_loop(a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}
// the scoped variants behave the same with one process of threads
#define atomicAdd_block atomicAdd
#define atomicAdd_system atomicAdd
#define atomicMax_block atomicMax
#define atomicMin_block atomicMin
#define atomicExch_block atomicExch
#define atomicCAS_block atomicCAS

// ---- arithmetic: min/max, fast-math intrinsics, conversions, bit tricks ------------------------
// CUDA overloads min/max for every arithmetic pair; the usual conversions pick the result type
namespace stitch_emu {
template <class T> struct arithmetic { static constexpr bool value = false; };
#define STITCH_ARITH(T) template <> struct arithmetic<T> { static constexpr bool value = true; };
STITCH_ARITH(char) STITCH_ARITH(signed char) STITCH_ARITH(unsigned char) STITCH_ARITH(short)
STITCH_ARITH(unsigned short) STITCH_ARITH(int) STITCH_ARITH(unsigned) STITCH_ARITH(long)
STITCH_ARITH(unsigned long) STITCH_ARITH(long long) STITCH_ARITH(unsigned long long) STITCH_ARITH(float)
STITCH_ARITH(double)
#undef STITCH_ARITH
}  // namespace stitch_emu
template <class A, class B> requires(stitch_emu::arithmetic<A>::value && stitch_emu::arithmetic<B>::value)
inline constexpr auto min(A a, B b) { using C = decltype(a + b); return (C)b < (C)a ? (C)b : (C)a; }
template <class A, class B> requires(stitch_emu::arithmetic<A>::value && stitch_emu::arithmetic<B>::value)
inline constexpr auto max(A a, B b) { using C = decltype(a + b); return (C)a < (C)b ? (C)b : (C)a; }

inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f)); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * erfc(-x * 0.70710678118654752); }
inline float sinpif(float x) { return sinf(3.14159265358979323846f * x); }
// CUDA's inverse error function (not in C++): Giles' approximation in double, then two Newton steps
inline double erfinv(double x) {
  if (!(x > -1.0 && x < 1.0)) return x == 1.0 ? INFINITY : x == -1.0 ? -INFINITY : NAN;
  double w = -log((1.0 - x) * (1.0 + x)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08; p = 3.43273939e-07 + p * w; p = -3.5233877e-06 + p * w; p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w; p = -0.00125372503 + p * w; p = -0.00417768164 + p * w; p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = sqrt(w) - 3.0;
    p = -0.000200214257; p = 0.000100950558 + p * w; p = 0.00134934322 + p * w; p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w; p = -0.0076224613 + p * w; p = 0.00943887047 + p * w; p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double y = p * x;
  for (int k = 0; k < 2; ++k) y -= (erf(y) - x) / (1.1283791670955126 * exp(-y * y));
  return y;
}
inline float erfinvf(float x) { return (float)erfinv((double)x); }
inline float cospif(float x) { return cosf(3.14159265358979323846f * x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline int __float2int_rd(float x) { return (int)floorf(x); }
inline int __float2int_ru(float x) { return (int)ceilf(x); }
inline unsigned __float2uint_rn(float x) { return (unsigned)nearbyintf(x); }
inline unsigned __float2uint_rz(float x) { return (unsigned)x; }
inline long long __float2ll_rn(float x) { return (long long)nearbyintf(x); }
inline long long __float2ll_rz(float x) { return (long long)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline float __double2float_rn(double x) { return (float)x; }
inline int __double2int_rn(double x) { return (int)nearbyint(x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long both = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32 | lo) << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)(((unsigned long long)hi << 32 | lo) >> (s & 31));
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }
inline void __nanosleep(unsigned) { stitch_emu::spin(); }
inline void __trap() { __builtin_trap(); }
inline void __brkpt() { __builtin_trap(); }
#define __builtin_assume(x) ((void)0)
#define CUDART_INF_F __builtin_inff()
#define CUDART_NAN_F __builtin_nanf("")
#define CUDART_INF __builtin_inf()
#define CUDART_NAN __builtin_nan("")
#define CUDART_PI_F 3.141592654f
#define CUDART_PI 3.1415926535897931e+0

// ======================================= the runtime ===========================================
#ifdef STITCH_EMU_RUNTIME
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && !defined(STITCH_EMU_UCONTEXT)
#define STITCH_EMU_SWITCH 1   // the hand-written switch below; swapcontext's signal-mask syscall costs ~1 us
#else
#include <ucontext.h>
#endif

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace stitch_emu {

// ---- fibers: every CUDA thread of a block is one, all on this one OS thread ----------------------
// A fiber runs until it waits at a collective or returns; then the scheduler resumes the next one
// that can go, in thread order, so every run of a kernel does the same thing (atomics included).
enum State : unsigned char { RUNNABLE, WAIT_BLOCK, WAIT_WARP, DONE };
struct Warp;
struct Fiber {
    void* sp = nullptr;                    // saved stack pointer while switched out
#ifndef STITCH_EMU_SWITCH
    ucontext_t ctx;
#endif
    unsigned char* stack = nullptr;        // lowest usable byte (a guard page lies below)
    uint3 tid{};
    unsigned lane = 0;
    Warp* warp = nullptr;
    State state = DONE;
    unsigned wait_want = 0;                // the warp collective it waits for: lanes and sequence number
    unsigned long long wait_n = 0;
    bool spun = false;                     // it last yielded in a spin-wait (__nanosleep), not at a collective
};
// 512 KiB: what a GPU thread may have as local memory; pages are committed only when touched
constexpr size_t STACK_BYTES = 512u << 10;
static size_t g_page = 4096;
// the running block's fibers, one per CUDA thread (see Resident below)
static std::vector<Fiber>* g_fibers = nullptr;
static Fiber* g_current = nullptr;         // null outside a fiber (the scheduler, or a kernel without collectives)
static Thunk g_thunk = nullptr;
static void* const* g_args = nullptr;

[[noreturn]] static void fail(int code, const char* what) {
    fprintf(stderr, "stitch-emulate: %s\n", what);
    fflush(stderr);
    _exit(code);
}

#ifdef STITCH_EMU_SWITCH
// stitch_emu_switch(&save, to): push the callee-saved registers, store the stack pointer in *save, load
// `to`, pop that fiber's and return into it. The SSE and x87 control words are not switched (saving them
// tripled the cost): nothing a CUDA kernel can call changes a rounding mode, so they are the same in all.
asm(R"(
    .text
    .p2align 4
    .type stitch_emu_switch, @function
stitch_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size stitch_emu_switch, .-stitch_emu_switch
)");
extern "C" void stitch_emu_switch(void** save, void* to);
static void* g_scheduler_sp = nullptr;
#else
static ucontext_t g_scheduler_ctx;
#endif

static void finish_fiber();
static void fiber_main() {
    g_thunk(g_args);
    finish_fiber();
}

// a fresh start at fiber_main, on the fiber's own stack (reused for every block)
static void prime(Fiber& f) {
#ifdef STITCH_EMU_SWITCH
    // each stack starts at its own offset in a page: stacks a page-multiple apart would put every
    // fiber's hot frames in the same few cache sets (a switch then misses the cache most of the time)
    const size_t stagger = (size_t)(&f - g_fibers->data()) % 64 * 64;
    void** sp = (void**)(((uintptr_t)f.stack + STACK_BYTES - stagger) & ~(uintptr_t)15);
    *--sp = nullptr;                       // fiber_main's return address: it never returns
    *--sp = (void*)&fiber_main;            // where the switch's `ret` goes
    for (int i = 0; i < 6; ++i) *--sp = nullptr;   // rbp, rbx, r12-r15
    f.sp = sp;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = STACK_BYTES;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}
static void enter(Fiber& f) {              // scheduler -> fiber
#ifdef STITCH_EMU_SWITCH
    stitch_emu_switch(&g_scheduler_sp, f.sp);
#else
    swapcontext(&g_scheduler_ctx, &f.ctx);
#endif
}
static void yield() {                      // fiber -> scheduler
    Fiber& f = *g_current;
#ifdef STITCH_EMU_SWITCH
    stitch_emu_switch(&f.sp, g_scheduler_sp);
#else
    swapcontext(&f.ctx, &g_scheduler_ctx);
#endif
}

// ---- crashes say where: which thread of which block, and a stack overflow as such ---------------
static unsigned char* g_stacks = nullptr;
static size_t g_stacks_bytes = 0;
static char g_altstack[64 << 10];
static void on_crash(int sig, siginfo_t* info, void*) {
    char line[256];
    const uintptr_t a = (uintptr_t)info->si_addr, base = (uintptr_t)g_stacks;
    const bool overflow = g_stacks && a >= base && a < base + g_stacks_bytes &&
                          (a - base) % (STACK_BYTES + g_page) < g_page;
    const uint3 t = g_current ? g_current->tid : threadIdx;
    int n = snprintf(line, sizeof line, "stitch-emulate: crashed in thread (%u, %u, %u) of block (%u, %u, %u)%s\n",
                     t.x, t.y, t.z, blockIdx.x, blockIdx.y, blockIdx.z,
                     overflow ? ": it overflowed its 512 KiB stack (local arrays too big?)" : "");
    if (n > 0) (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    signal(sig, SIG_DFL);
    raise(sig);
}
static void catch_crashes() {
    stack_t ss{};
    ss.ss_sp = g_altstack;
    ss.ss_size = sizeof g_altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa{};
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

[[noreturn]] static void not_in_fiber() {
    // emulate.py runs a kernel as a plain loop only when its source names no collective
    fail(4, "a collective ran in a kernel emulated without fibers (its source hides the call from the scan)");
}

// ---- __syncthreads: released when every live thread of the block has arrived; a thread that returns
// leaves, so the others are released without it (an early return must not deadlock them) ----------
struct BlockBarrier {
    unsigned live = 0, arrived = 0;
    int count = 0, all = 1, any = 0;                       // this phase's predicates
    int last_count = 0, last_all = 1, last_any = 0;        // the released phase's

    void reset(unsigned n) { live = n; arrived = 0; count = 0; all = 1; any = 0; }
    void release() {
        last_count = count; last_all = all; last_any = any;
        count = 0; all = 1; any = 0; arrived = 0;
        for (Fiber& f : *g_fibers)
            if (f.state == WAIT_BLOCK) f.state = RUNNABLE;
    }
    int sync(int p, int op) {
        if (!g_current) not_in_fiber();
        count += p != 0; all &= p != 0; any |= p != 0;
        if (++arrived == live) {
            release();                      // the last to arrive goes on at once
        } else {
            g_current->state = WAIT_BLOCK;
            yield();
        }
        return op == BLOCK_COUNT ? last_count : op == BLOCK_AND ? last_all : op == BLOCK_OR ? last_any : 0;
    }
    void leave() {
        --live;
        if (arrived > 0 && arrived == live) release();
    }
};

// Warp collectives: lane L's n-th collective publishes its value in slot[n % 2][L] and waits until
// every live lane of the mask has published its n-th; two slots suffice because no lane can get two
// collectives ahead of a lane it waits for. Lanes that returned drop out of `live`.
// The lowest sequence number among the live lanes (and how many are at it) answers the common case, a
// full-warp mask, without looking at every lane: it is rescanned once per collective, not per lane.
struct Warp {
    unsigned live = 0, lanes = 0;          // bit per lane still running; lanes in this (maybe partial) warp
    unsigned all = 0;                      // bit per lane of this warp
    unsigned long long seq[32] = {};
    unsigned long long slot[2][32] = {};
    unsigned long long min_seq = 0;
    unsigned at_min = 0;

    void reset(unsigned n) {
        lanes = n; all = live = n >= 32 ? 0xffffffffu : (1u << n) - 1;
        for (auto& s : seq) s = 0;
        min_seq = 0;
        at_min = n;
    }
    void rescan() {
        min_seq = ~0ull;
        at_min = 0;
        for (unsigned m = live; m; m &= m - 1) {
            const unsigned long long s = seq[__builtin_ctz(m)];
            if (s < min_seq) { min_seq = s; at_min = 0; }
            at_min += s == min_seq;
        }
    }
    void publish(unsigned lane) {          // lane's seq goes up by one
        if (seq[lane]++ == min_seq && --at_min == 0) rescan();
    }
    void leave(unsigned lane) {
        live &= ~(1u << lane);
        if (seq[lane] == min_seq && --at_min == 0) rescan();
    }
    // has every live lane of `want` published its n-th collective?
    bool ready(unsigned want, unsigned long long n) const {
        if (min_seq >= n) return true;
        if ((live & ~want) == 0) return false;  // the slowest live lane is one of want's
        for (unsigned m = want & live; m; m &= m - 1)
            if (seq[__builtin_ctz(m)] < n) return false;
        return true;
    }
    // the lanes of `want` that took part in the n-th (one may have returned since: its slot still
    // holds what it published)
    unsigned took_part(unsigned want, unsigned long long n) const {
        if (min_seq >= n && (want & all & ~live) == 0) return want & live;
        unsigned g = 0;
        for (unsigned m = want & all; m; m &= m - 1)
            if (seq[__builtin_ctz(m)] >= n) g |= m & -m;
        return g;
    }
};

static BlockBarrier* g_block = nullptr;    // the running block's

int block_sync(int p, int op) { return g_block->sync(p, op); }

void spin() {
    if (!g_current) {                       // a kernel run as a plain loop: nothing else could run
        __builtin_ia32_pause();
        return;
    }
    g_current->spun = true;
    yield();
}

static void finish_fiber() {
    Fiber& f = *g_current;
    f.state = DONE;
    g_block->leave();
    f.warp->leave(f.lane);
    yield();                                // never resumed: the next block primes the stack afresh
    __builtin_unreachable();
}

static unsigned long long reduce_lanes(const unsigned long long* slot, unsigned group, int op, bool is_signed) {
    unsigned long long r = 0;
    bool first = true;
    for (unsigned j = 0; j < 32; ++j) {
        if (!(group >> j & 1)) continue;
        unsigned u = (unsigned)slot[j];
        int s = (int)u;
        if (first) { r = u; first = false; continue; }
        switch (op) {
            case REDUCE_ADD: r = (unsigned)(r + u); break;
            case REDUCE_MIN: r = is_signed ? (unsigned)(s < (int)r ? s : (int)r) : (u < r ? u : r); break;
            case REDUCE_MAX: r = is_signed ? (unsigned)(s > (int)r ? s : (int)r) : (u > r ? u : r); break;
            case REDUCE_AND: r &= u; break;
            case REDUCE_OR: r |= u; break;
            case REDUCE_XOR: r ^= u; break;
        }
    }
    return r;
}

unsigned long long warp_op(unsigned mask, unsigned long long value, int op, int arg, int width) {
    if (!g_current) not_in_fiber();
    Fiber& f = *g_current;
    Warp& w = *f.warp;
    const unsigned me = f.lane;
    if (op == ACTIVE) return w.live;
    w.publish(me);
    const unsigned long long n = w.seq[me];
    unsigned long long* slot = w.slot[n & 1];
    slot[me] = value;
    const unsigned want = mask | 1u << me;
    if (!w.ready(want, n)) {                // the scheduler resumes it once they all have
        f.state = WAIT_WARP;
        f.wait_want = want;
        f.wait_n = n;
        yield();
    }
    if (width <= 0 || width > 32) width = 32;
    const unsigned seg = me & ~(unsigned)(width - 1), pos = me & (unsigned)(width - 1);
    long src = -1;
    switch (op) {
        case SHFL_IDX: src = seg + ((unsigned)arg & (unsigned)(width - 1)); break;
        case SHFL_UP: src = pos >= (unsigned)arg ? (long)me - arg : (long)me; break;
        case SHFL_DOWN: src = pos + (unsigned)arg < (unsigned)width ? (long)me + arg : (long)me; break;
        case SHFL_XOR: {
            unsigned t = me ^ (unsigned)arg;
            src = (t & ~(unsigned)(width - 1)) == seg ? (long)t : (long)me;
            break;
        }
        case BALLOT: case ANY: case ALL: case MATCH_ANY: {
            const unsigned g = w.took_part(want, n);
            unsigned b = 0;
            for (unsigned j = 0; j < 32; ++j)
                if ((g >> j & 1) && (op == MATCH_ANY ? slot[j] == value : slot[j] != 0)) b |= 1u << j;
            return op == BALLOT || op == MATCH_ANY ? b : op == ANY ? b != 0 : b == g;
        }
        case SYNC: return 0;
        default: return reduce_lanes(slot, w.took_part(want, n), op, arg != 0);
    }
    if (src < 0 || src >= (long)w.lanes) src = me;     // a lane outside the warp: keep one's own value
    return slot[src];
}

// ---- running a block -------------------------------------------------------------------------
// Without collectives (emulate.py's scan of the source), a block is a plain loop over its threads.
static void run_block_loop(uint3 block) {
    blockIdx = block;
    for (unsigned z = 0; z < blockDim.z; ++z)
        for (unsigned y = 0; y < blockDim.y; ++y)
            for (unsigned x = 0; x < blockDim.x; ++x) {
                threadIdx = {x, y, z};
                g_thunk(g_args);
            }
}

// ---- blocks that run at once ---------------------------------------------------------------------
// Blocks start in grid order, one at a time; a block runs until its threads return or every one that
// has not waits, spinning on memory another block writes (a split row's flag). Only then does the next
// block start beside it, and the running ones take turns: so a kernel whose blocks never wait for each
// other runs its blocks one after another, as before. Each running block has its own fibers and its
// own shared memory (emulate.py's rewrite of the __shared__ declarations).
struct Resident {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    BlockBarrier barrier;
    unsigned char* stacks = nullptr;
    size_t stacks_bytes = 0;
    uint3 idx{};
    unsigned remaining = 0;                // its threads that have not returned
    unsigned char* statics = nullptr;      // its __shared__ declarations (offsets from g_statics)
    unsigned char* dynamic = nullptr;      // its dynamic shared memory
};
constexpr unsigned MAX_RESIDENT = 256;     // blocks that may wait on each other at once
static unsigned g_dynamic_bytes = 0;
static Resident* g_running = nullptr;
// each __shared__ declaration's offset in a block's statics, by its key; the same in every block
static std::vector<std::pair<const void*, unsigned long>> g_statics;
static unsigned long g_statics_end = 0;
alignas(256) static unsigned char g_outside[MAX_STATIC_SHARED];   // a declaration outside any block

void* block_static(const void* key, unsigned long size, unsigned long align) {
    unsigned long at = ~0ul;
    for (const auto& [k, off] : g_statics)
        if (k == key) at = off;
    if (at == ~0ul) {
        at = (g_statics_end + align - 1) / align * align;
        if (at + size > MAX_STATIC_SHARED) fail(3, "more than 48 KiB of static shared memory in one block");
        g_statics.push_back({key, at});
        g_statics_end = at + size;
    }
    return (g_running ? g_running->statics : g_outside) + at;
}
void* block_dynamic() { return g_running->dynamic; }

static void make_fibers(Resident& r, unsigned n) {
    g_page = (size_t)sysconf(_SC_PAGESIZE);
    r.stacks_bytes = (size_t)n * (STACK_BYTES + g_page);
    void* mem = mmap(nullptr, r.stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (mem == MAP_FAILED) fail(3, "cannot map the fibers' stacks");
    r.stacks = (unsigned char*)mem;
    r.statics = (unsigned char*)aligned_alloc(256, MAX_STATIC_SHARED);
    r.dynamic = (unsigned char*)aligned_alloc(256, (g_dynamic_bytes + 255) / 256 * 256 + 256);
    if (!r.statics || !r.dynamic) fail(3, "cannot allocate a block's shared memory");
    r.fibers.resize(n);
    r.warps.resize((n + 31) / 32);
    for (unsigned i = 0; i < n; ++i) {
        unsigned char* lo = r.stacks + (size_t)i * (STACK_BYTES + g_page);
        mprotect(lo, g_page, PROT_NONE);    // an overflow faults here instead of running into the next stack
        Fiber& f = r.fibers[i];
        f.stack = lo + g_page;
        f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
        f.lane = i % 32;
        f.warp = &r.warps[i / 32];
    }
}

static void switch_to(Resident& r) {
    g_running = &r;
    g_fibers = &r.fibers;
    g_block = &r.barrier;
    g_stacks = r.stacks;
    g_stacks_bytes = r.stacks_bytes;
    blockIdx = r.idx;
}

static void start_block(Resident& r, uint3 block) {
    r.idx = block;
    switch_to(r);
    const unsigned n = (unsigned)r.fibers.size();
    r.barrier.reset(n);
    for (unsigned w = 0; w < r.warps.size(); ++w) r.warps[w].reset(n - 32 * w < 32 ? n - 32 * w : 32);
    for (Fiber& f : r.fibers) {
        f.state = RUNNABLE;
        f.spun = false;
        prime(f);
    }
    r.remaining = n;
}

[[noreturn]] static void deadlock(uint3 block) {
    unsigned at_block = 0, at_warp = 0;
    for (const Fiber& f : *g_fibers) {
        at_block += f.state == WAIT_BLOCK;
        at_warp += f.state == WAIT_WARP;
    }
    char line[256];
    snprintf(line, sizeof line, "deadlock in block (%u, %u, %u): %u threads wait at __syncthreads, %u at a warp "
             "collective that lanes of its mask never reach", block.x, block.y, block.z, at_block, at_warp);
    fail(5, line);
}

// round robin in thread order over the fibers that can go, until all have returned or a full turn
// passes in which none went on but by spinning (the block waits for another: returns whether anything
// moved); a full turn in which none can go at all is a deadlock
static bool run_until_waiting(Resident& r) {
    switch_to(r);
    const unsigned n = (unsigned)r.fibers.size();
    bool moved = false;
    unsigned idle = 0;
    for (unsigned i = 0; r.remaining > 0; i = i + 1 == n ? 0 : i + 1) {
        Fiber& f = r.fibers[i];
        if (f.state == RUNNABLE || (f.state == WAIT_WARP && f.warp->ready(f.wait_want, f.wait_n))) {
            f.state = RUNNABLE;
            f.spun = false;
            g_current = &f;
            threadIdx = f.tid;
            enter(f);
            g_current = nullptr;
            r.remaining -= f.state == DONE;
            if (!f.spun) {
                moved = true;
                idle = 0;
                continue;
            }
        }
        if (++idle >= n) {
            for (const Fiber& g : r.fibers)
                if (g.state == RUNNABLE) return moved;    // a spinner: another block must go first
            deadlock(r.idx);
        }
    }
    return true;
}

static uint3 block_at(unsigned long long k) {
    return {(unsigned)(k % gridDim.x), (unsigned)(k / gridDim.x % gridDim.y),
            (unsigned)(k / ((unsigned long long)gridDim.x * gridDim.y))};
}

static void run_grid_fibers(unsigned threads) {
    static std::vector<Resident*> pool;     // kept between calls: stacks are mapped once
    std::vector<Resident*> running;
    size_t used = 0;
    const unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
    unsigned long long next = 0;
    for (;;) {
        bool moved = false;
        for (size_t k = 0; k < running.size();) {
            moved |= run_until_waiting(*running[k]);
            if (running[k]->remaining == 0) {
                const auto at = std::find(pool.begin(), pool.begin() + (long)used, running[k]);
                --used;
                std::iter_swap(at, pool.begin() + (long)used);      // back among the free ones
                running.erase(running.begin() + (long)k);
                moved = true;
            } else {
                ++k;
            }
        }
        if (moved && !running.empty()) continue;
        if (next == blocks) {
            if (running.empty()) return;
            fail(5, "deadlock: every running block spin-waits on another, and no block is left to start");
        }
        if (running.size() == MAX_RESIDENT) {
            char line[160];
            snprintf(line, sizeof line, "deadlock: %u blocks running at once all spin-wait on each other",
                     MAX_RESIDENT);
            fail(5, line);
        }
        if (used == pool.size()) {
            pool.push_back(new Resident());
            make_fibers(*pool.back(), threads);
        }
        Resident* r = pool[used++];
        start_block(*r, block_at(next++));
        running.push_back(r);
    }
}

// ---- the driver: argument buffers in, every call in order, buffers out ------------------------
// File format (agent_core/writer/executors.py): "STBUF001", u64 calls, per call u64 args and one u64
// byte count per arg, then every buffer's bytes in order. The output file has the same layout and
// holds each call's buffers as they were right after that call.
static bool read_u64(FILE* f, unsigned long long* v) { return fread(v, 8, 1, f) == 1; }

int driver_main(int argc, char** argv, int nparams, Thunk thunk, bool collectives) {
    if (argc != 11) {
        fprintf(stderr, "usage: %s IN OUT GUARD GX GY GZ BX BY BZ SHARED\n", argv[0]);
        return 2;
    }
    catch_crashes();
    const unsigned long long guard = strtoull(argv[3], nullptr, 10);
    gridDim = dim3((unsigned)atoi(argv[4]), (unsigned)atoi(argv[5]), (unsigned)atoi(argv[6]));
    blockDim = dim3((unsigned)atoi(argv[7]), (unsigned)atoi(argv[8]), (unsigned)atoi(argv[9]));
    const unsigned shared = (unsigned)atoi(argv[10]);
    g_dynamic_bytes = shared;
    if (shared > MAX_DYNAMIC_SHARED) {
        fprintf(stderr, "stitch-emulate: %u bytes of dynamic shared memory, at most %u\n", shared, MAX_DYNAMIC_SHARED);
        return 3;
    }
    FILE* in = fopen(argv[1], "rb");
    char magic[8];
    unsigned long long ncalls = 0;
    if (!in || fread(magic, 1, 8, in) != 8 || memcmp(magic, "STBUF001", 8) != 0 || !read_u64(in, &ncalls)) {
        fprintf(stderr, "stitch-emulate: %s is not a buffer file\n", argv[1]);
        return 2;
    }
    std::vector<std::vector<unsigned long long>> sizes(ncalls);
    for (auto& call : sizes) {
        unsigned long long nargs = 0;
        if (!read_u64(in, &nargs)) return 2;
        call.resize(nargs);
        for (auto& s : call)
            if (!read_u64(in, &s)) return 2;
    }
    std::vector<std::vector<unsigned char*>> buffers(ncalls);
    for (unsigned long long c = 0; c < ncalls; ++c)
        for (unsigned long long s : sizes[c]) {
            // 256-byte aligned like a cudaMalloc, so pointer + guard keeps the alignment float4 needs
            unsigned char* b = (unsigned char*)aligned_alloc(256, (s + 255) / 256 * 256 + 256);
            if (!b || fread(b, 1, s, in) != s) {
                fprintf(stderr, "stitch-emulate: %s is truncated\n", argv[1]);
                return 2;
            }
            buffers[c].push_back(b);
        }
    fclose(in);
    FILE* out = fopen(argv[2], "wb");
    fwrite("STBUF001", 1, 8, out);
    fwrite(&ncalls, 8, 1, out);
    for (auto& call : sizes) {
        unsigned long long nargs = call.size();
        fwrite(&nargs, 8, 1, out);
        fwrite(call.data(), 8, nargs, out);
    }
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    for (unsigned long long c = 0; c < ncalls; ++c) {
        if ((int)sizes[c].size() != nparams) {
            fprintf(stderr, "stitch-emulate: the kernel takes %d pointer arguments, call %llu passes %zu\n",
                    nparams, c + 1, sizes[c].size());
            return 3;
        }
        fprintf(stderr, "stitch-emulate: call %llu of %llu\n", c + 1, ncalls);
        std::vector<void*> args;
        for (unsigned char* b : buffers[c]) args.push_back(b + guard);
        g_thunk = thunk;
        g_args = args.data();
        if (collectives && threads > 0) {
            run_grid_fibers(threads);
        } else {
            for (unsigned z = 0; z < gridDim.z; ++z)
                for (unsigned y = 0; y < gridDim.y; ++y)
                    for (unsigned x = 0; x < gridDim.x; ++x) run_block_loop({x, y, z});
        }
        for (unsigned long long a = 0; a < sizes[c].size(); ++a) fwrite(buffers[c][a], 1, sizes[c][a], out);
    }
    if (fclose(out) != 0) return 2;
    fflush(stdout);
    return 0;
}
}  // namespace stitch_emu
#endif  // STITCH_EMU_RUNTIME
#endif  // STITCH_EMULATE_SHIM_H
