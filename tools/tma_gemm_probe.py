"""How fast a warp-specialised TMA + wgmma TF32 GEMM of our own runs against cuBLAS, before it becomes
the tile GEMM's main loop: the question is whether the mainloop design can come within 10% of cuBLAS's
split TF32 (issue 16), where the tile GEMM's register-A wgmma loop reached 0.53x.

The kernel: C[M, N] = A[M, K] B[N, K]^T, both K-major fp32 read by the tensor cores as TF32. One producer
warpgroup (one thread issuing TMA copies of 128-byte-swizzled slices into a ring of stages, each stage
signalled by an mbarrier's transaction count) and two consumer warpgroups of 64 rows each (wgmma with
both operands from shared memory, one group left in flight, each stage handed back through a second
mbarrier once its products are done). Split TF32 runs it over [lo, hi, hi] of A and [hi, lo, hi] of B
concatenated along K, exactly the operands of the library's one-call form, so the comparison is the
same precision form and the same arithmetic.

    python3 tools/tma_gemm_probe.py [--shapes 4096x4096x4096,...] [--configs 256:4:2:1,...]
    python3 tools/tma_gemm_probe.py --compile-only        (no GPU: builds each variant for sm_90a)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_core.compiler import compile_source  # noqa: E402

BM, BK = 128, 32


def source(bn: int, stages: int, cl: int = 1, group: int = 8) -> str:
    """cl: CTAs of a cluster along M sharing B's slice (each copies 1/cl of it to all, TMA multicast).
    Persistent when launched with fewer CTAs than tiles: each cluster walks tiles gridDim.x / cl apart in
    the grouped order (group M-tile clusters by every N-tile, then the next group), so the producer
    fetches the next tile's slices while the consumers store this one's."""
    n = bn // 2
    dregs = ", ".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(n))
    return f"""
#define BM {BM}
#define BN {bn}
#define BK {BK}
#define ST {stages}
#define CL {cl}
#define GROUP {group}
typedef unsigned long long u64;
__device__ __forceinline__ unsigned s32(const void* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}
__device__ __forceinline__ void mbar_init(u64* b, unsigned c) {{
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(s32(b)), "r"(c) : "memory"); }}
__device__ __forceinline__ void mbar_expect(u64* b, unsigned bytes) {{
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s32(b)), "r"(bytes) : "memory"); }}
// one arrival on the barrier at this offset in CTA `cta` of the cluster (this CTA's own where CL is 1)
__device__ __forceinline__ void mbar_arrive_at(u64* b, unsigned cta) {{
  asm volatile("{{\\n.reg .b32 ra;\\nmapa.shared::cluster.u32 ra, %0, %1;\\n"
               "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\\n}}" :: "r"(s32(b)), "r"(cta) : "memory"); }}
__device__ __forceinline__ void release(u64* b) {{
  if (CL == 1) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(s32(b)) : "memory");
  else for (int c = 0; c < CL; ++c) mbar_arrive_at(b, c);
}}
__device__ __forceinline__ bool mbar_try(u64* b, unsigned parity) {{
  unsigned ok;
  asm volatile("{{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}}"
               : "=r"(ok) : "r"(s32(b)), "r"(parity) : "memory");
  return ok;
}}
__device__ __forceinline__ void mbar_wait(u64* b, unsigned parity) {{ while (!mbar_try(b, parity)) {{}} }}
__device__ __forceinline__ void tma_2d(void* dst, const void* map, u64* bar, int c0, int c1) {{
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], [%4];"
               :: "r"(s32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(s32(bar)) : "memory");
}}
// the same box into this offset of every CTA of the cluster, each CTA's barrier at bar's offset counting it
__device__ __forceinline__ void tma_2d_all(void* dst, const void* map, u64* bar, int c0, int c1) {{
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {{%2, %3}}], [%4], %5;"
               :: "r"(s32(dst)), "l"(map), "r"(c0), "r"(c1), "r"(s32(bar)), "h"((unsigned short)((1 << CL) - 1)) : "memory");
}}
__device__ __forceinline__ void cluster_sync() {{
  asm volatile("barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n" ::: "memory"); }}
__device__ __forceinline__ unsigned cluster_rank() {{
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }}
__device__ __forceinline__ u64 desc(const float* p) {{
  const u64 a = s32(p);
  return ((a & 0x3FFFFull) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}}
__device__ __forceinline__ void wg_fence() {{ asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }}
__device__ __forceinline__ void wg_commit() {{ asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }}
template <int N> __device__ __forceinline__ void wg_wait() {{ asm volatile("wgmma.wait_group.sync.aligned %0;\\n" :: "n"(N) : "memory"); }}
__device__ __forceinline__ void hold(float& x) {{ asm volatile("" : "+f"(x) :: "memory"); }}
__device__ __forceinline__ void mma(float* d, u64 a, u64 b) {{
  asm volatile("{{\\nwgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 {{{dregs}}}, %{n}, %{n + 1}, 1, 1, 1;\\n}}\\n"
               : {outs} : "l"(a), "l"(b));
}}
// tile p of the grouped order: GROUP clusters of M tiles down each N tile, then the next group
__device__ __forceinline__ void tile_at(int p, int PM, int NT, int& pm, int& tn) {{
  const int in_group = GROUP * NT, first = (p / in_group) * GROUP, size = min(PM - first, GROUP);
  pm = first + (p % in_group) % size;
  tn = (p % in_group) / size;
}}

extern "C" __global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(384, 1)
tma_gemm(const unsigned char* maps, float* __restrict__ C, int M, int N, int K) {{
  extern __shared__ __align__(1024) unsigned char raw[];
  float* As = reinterpret_cast<float*>(raw + ((1024u - (s32(raw) & 1023u)) & 1023u));
  float* Bs = As + ST * BM * BK;
  u64* full = reinterpret_cast<u64*>(Bs + ST * BN * BK);
  u64* empty = full + ST;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int KT = (K + BK - 1) / BK;
  const int MT = (M + BM - 1) / BM, NT = (N + BN - 1) / BN, PM = (MT + CL - 1) / CL, tiles = PM * NT;
  const int rank = CL > 1 ? (int)cluster_rank() : 0, first = blockIdx.x / CL, step = gridDim.x / CL;
  if (tid == 0) {{
    for (int s = 0; s < ST; ++s) {{ mbar_init(&full[s], 1); mbar_init(&empty[s], 2 * CL); }}
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
  }}
  if (CL > 1) cluster_sync(); else __syncthreads();
  if (wg == 0) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\\n");
    if (tid == 0) {{
      int it = 0;
      for (int p = first; p < tiles; p += step) {{
        int pm, tn;
        tile_at(p, PM, NT, pm, tn);
        const int m0 = (pm * CL + rank) * BM, n0 = tn * BN;
        for (int kt = 0; kt < KT; ++kt, ++it) {{
          const int s = it % ST;
          if (it >= ST) mbar_wait(&empty[s], ((it / ST) - 1) & 1);
          mbar_expect(&full[s], (BM + BN) * BK * 4);
          tma_2d(As + s * BM * BK, maps, &full[s], kt * BK, m0);
          if (CL > 1) tma_2d_all(Bs + s * BN * BK + rank * (BN / CL) * BK, maps + 128, &full[s], kt * BK, n0 + rank * (BN / CL));
          else tma_2d(Bs + s * BN * BK, maps + 128, &full[s], kt * BK, n0);
        }}
      }}
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\\n");
    const int cw = wg - 1;
    const int w = (tid & 127) >> 5, g = (tid & 31) >> 2, t = tid & 3;
    const bool leader = (tid & 127) == 0;
    int it = 0;
    for (int p = first; p < tiles; p += step) {{
      int pm, tn;
      tile_at(p, PM, NT, pm, tn);
      const int m0 = (pm * CL + rank) * BM, n0 = tn * BN;
      float d[BN / 2];
      #pragma unroll
      for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
      for (int kt = 0; kt < KT; ++kt, ++it) {{
        const int s = it % ST;
        mbar_wait(&full[s], (it / ST) & 1);
        const float* a = As + s * BM * BK + cw * 64 * BK;
        const float* b = Bs + s * BN * BK;
        #pragma unroll
        for (int i = 0; i < BN / 2; ++i) hold(d[i]);
        wg_fence();
        #pragma unroll
        for (int ks = 0; ks < BK / 8; ++ks) mma(d, desc(a + ks * 8), desc(b + ks * 8));
        wg_commit();
        wg_wait<1>();
        #pragma unroll
        for (int i = 0; i < BN / 2; ++i) hold(d[i]);
        // the products of slice it - 1 are done: its stage is free in every CTA that shares it
        if (kt > 0 && leader) release(&empty[(it - 1) % ST]);
      }}
      wg_wait<0>();
      #pragma unroll
      for (int i = 0; i < BN / 2; ++i) hold(d[i]);
      if (leader) release(&empty[(it - 1) % ST]);
      #pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt)
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
          const int r = m0 + cw * 64 + w * 16 + g + 8 * h, c = n0 + nt * 8 + 2 * t;
          if (r < M && c + 1 < N) *reinterpret_cast<float2*>(C + (long long)r * N + c) = make_float2(d[nt * 4 + 2 * h], d[nt * 4 + 2 * h + 1]);
          else if (r < M && c < N) C[(long long)r * N + c] = d[nt * 4 + 2 * h];
        }}
    }}
  }}
  if (CL > 1) cluster_sync();   // no CTA leaves while its peer may still arrive on its barriers
}}
"""


SPLIT_HEAD = """
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool ok) {{
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(s32(dst)), "l"(src), "r"(ok ? 16 : 0));
}}
__device__ __forceinline__ void cp_async_commit() {{ asm volatile("cp.async.commit_group;\\n" ::); }}
template <int N> __device__ __forceinline__ void cp_async_wait() {{ asm volatile("cp.async.wait_group %0;\\n" :: "n"(N)); }}
__device__ __forceinline__ void producers_sync() {{ asm volatile("bar.sync 1, %0;\\n" :: "n"(PT) : "memory"); }}
__device__ __forceinline__ void fence_proxy_async() {{ asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory"); }}
__device__ __forceinline__ void mbar_arrive(u64* b) {{
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(s32(b)) : "memory"); }}
"""


def split_source(bn: int, stages: int, slice_acc: bool, tma: bool = False, pw: int = 1, param_maps: bool = False) -> str:
    """The same warp-specialised loop over the raw operands, split TF32 inside the kernel: the producer
    warpgroup (128 threads) copies each k slice of A and B with cp.async into the 128-byte-swizzled
    layout, then splits it in shared memory (hi rounded in place, lo beside it), so no workspace and one
    read of each operand slice feed all three products: a_lo b_hi, a_hi b_lo, a_hi b_hi per 8-wide k step.
    slice_acc: each slice's products summed apart and added to the running sums in fp32 (the sums' error
    over a long K), at the price of waiting for each slice's products. tma: one producer thread copies each
    slice with two TMA copies (tensor maps as tma_gemm's), the others only split. pw: producer warpgroups
    (the split's threads). param_maps: the tensor maps passed by value (__grid_constant__ parameters)
    rather than through global memory."""
    P = 128 * pw
    base = source(bn, stages, 1)
    head = base.split('extern "C"')[0]
    sums = "sacc" if slice_acc else "d"
    return head + f"#define PT {P}   // producer threads\n" + SPLIT_HEAD.format() + f"""
#define SLICE (BM + BN) * BK   // floats of one k slice of A and B
struct __align__(64) TmaMap {{ unsigned long long v[16]; }};
extern "C" __global__ void __launch_bounds__({P + 256}, 1)
split_gemm({"const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, " if param_maps else "const unsigned char* maps, " if tma else ""}const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {{
  extern __shared__ __align__(1024) unsigned char raw[];
  float* hi = reinterpret_cast<float*>(raw + ((1024u - (s32(raw) & 1023u)) & 1023u));   // [ST][A rows, B rows][32]
  float* lo = hi + ST * SLICE;
  u64* full = reinterpret_cast<u64*>(lo + ST * SLICE);
  u64* empty = full + ST;
  u64* landed = empty + ST;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int KT = (K + BK - 1) / BK;
  const int MT = (M + BM - 1) / BM, NT = (N + BN - 1) / BN;
  int pm, tn;
  tile_at(blockIdx.x, MT, NT, pm, tn);
  const int m0 = pm * BM, n0 = tn * BN;
  if (tid == 0) {{
    for (int s = 0; s < ST; ++s) {{ mbar_init(&full[s], PT); mbar_init(&empty[s], 2); mbar_init(&landed[s], 1); }}
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
  }}
  __syncthreads();
  if (tid < PT) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 {56 if pw == 1 else 40};\\n");
    auto issue = [&](int it) {{{TMA_ISSUE.replace("maps + 128", "&map_b").replace("maps,", "&map_a,") if param_maps else TMA_ISSUE if tma else ""}
      float* st = hi + (it % ST) * SLICE;
      const int k0 = it * BK;
      for (int e = tid; e < (BM + BN) * 8; e += PT) {{
        const int r = e >> 3, c = e & 7, gk = k0 + 4 * c;
        const bool is_a = r < BM;
        const int gr = is_a ? m0 + r : n0 + r - BM;
        const bool ok = (is_a ? gr < M : gr < N) && gk < K;
        const float* src = is_a ? A + (long long)gr * K + gk : B + (long long)gr * K + gk;
        cp_async16(st + r * 32 + ((c ^ (r & 7)) << 2), ok ? src : A, ok);
      }}
      cp_async_commit();
    }};
    auto landed_wait = [&](int it) {{{"mbar_wait(&landed[it % ST], (it / ST) & 1);" if tma else ""}}};
    // the next slice's copies go out before this one is split where its stage is sure to be free by then:
    // with two stages and one group of products left in flight, the consumers free it only after this
    // slice's products are issued, so its copies wait until this slice is split
    constexpr bool kAhead = ST > 2 || {int(slice_acc)};
    issue(0);
    for (int it = 0; it < KT; ++it) {{
      const int s = it % ST;
      if (kAhead && it + 1 < KT) {{
        if (it + 1 >= ST) mbar_wait(&empty[(it + 1) % ST], (((it + 1) / ST) - 1) & 1);
        issue(it + 1);
        cp_async_wait<1>();
      }} else cp_async_wait<0>();
      landed_wait(it);
      producers_sync();                 // slice it has landed, every producer's copies
      float4* h4 = reinterpret_cast<float4*>(hi + s * SLICE);
      float4* l4 = reinterpret_cast<float4*>(lo + s * SLICE);
      for (int e = tid; e < SLICE / 4; e += PT) {{
        float4 x = h4[e], h, l;
        #define SPLIT1(f) {{ const unsigned b = __float_as_uint(x.f) + 0x1000u; h.f = __uint_as_float(b); l.f = x.f - __uint_as_float(b & 0xffffe000u); }}
        SPLIT1(x) SPLIT1(y) SPLIT1(z) SPLIT1(w)
        h4[e] = h; l4[e] = l;
      }}
      fence_proxy_async();              // these writes, and the copies, visible to the tensor cores
      mbar_arrive(&full[s]);
      if (!kAhead && it + 1 < KT) {{
        if (it + 1 >= ST) mbar_wait(&empty[(it + 1) % ST], (((it + 1) / ST) - 1) & 1);
        issue(it + 1);
      }}
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {224 if pw == 1 else 216};\\n");
    const int cw = wg - {pw};
    const int w = (tid & 127) >> 5, g = (tid & 31) >> 2, t = tid & 3;
    float d[BN / 2];
    #pragma unroll
    for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
    {"float sacc[BN / 2];" if slice_acc else ""}
    for (int it = 0; it < KT; ++it) {{
      const int s = it % ST;
      mbar_wait(&full[s], (it / ST) & 1);
      const float* ah = hi + s * SLICE + cw * 64 * BK;
      const float* bh = hi + s * SLICE + BM * BK;
      const float* al = lo + s * SLICE + cw * 64 * BK;
      const float* bl = lo + s * SLICE + BM * BK;
      {"#pragma unroll" if slice_acc else ""}
      {"for (int i = 0; i < BN / 2; ++i) sacc[i] = 0.0f;" if slice_acc else ""}
      #pragma unroll
      for (int i = 0; i < BN / 2; ++i) hold({sums}[i]);
      wg_fence();
      #pragma unroll
      for (int ks = 0; ks < BK / 8; ++ks) {{
        mma({sums}, desc(al + ks * 8), desc(bh + ks * 8));
        mma({sums}, desc(ah + ks * 8), desc(bl + ks * 8));
        mma({sums}, desc(ah + ks * 8), desc(bh + ks * 8));
      }}
      wg_commit();
      {"wg_wait<0>();" if slice_acc else "wg_wait<1>();"}
      #pragma unroll
      for (int i = 0; i < BN / 2; ++i) {{ hold({sums}[i]); {"d[i] += sacc[i];" if slice_acc else ""} }}
      if ((tid & 127) == 0) {{
        {"mbar_arrive(&empty[s]);" if slice_acc else "if (it > 0) mbar_arrive(&empty[(it - 1) % ST]);"}
      }}
    }}
    wg_wait<0>();
    #pragma unroll
    for (int i = 0; i < BN / 2; ++i) hold(d[i]);
    #pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
      #pragma unroll
      for (int h = 0; h < 2; ++h) {{
        const int r = m0 + cw * 64 + w * 16 + g + 8 * h, c = n0 + nt * 8 + 2 * t;
        if (r < M && c + 1 < N) *reinterpret_cast<float2*>(C + (long long)r * N + c) = make_float2(d[nt * 4 + 2 * h], d[nt * 4 + 2 * h + 1]);
        else if (r < M && c < N) C[(long long)r * N + c] = d[nt * 4 + 2 * h];
      }}
  }}
}}
"""


TMA_ISSUE = """
      if (tid == 0) {
        const int s = it % ST;
        mbar_expect(&landed[s], SLICE * 4);
        tma_2d(hi + s * SLICE, maps, &landed[s], it * BK, m0);
        tma_2d(hi + s * SLICE + BM * BK, maps + 128, &landed[s], it * BK, n0);
      }
      return;"""


def split_shared_bytes(bn: int, stages: int) -> int:
    return 2 * stages * (BM + bn) * BK * 4 + 3 * stages * 8 + 1024


def shared_bytes(bn: int, stages: int) -> int:
    return stages * (BM + bn) * BK * 4 + 2 * stages * 8 + 1024


def tensor_map(t, box_rows: int):
    """The runtime's CUtensorMap (runtime/tensor_map.py) of a row-major fp32 [rows, K] tensor, boxes of
    box_rows x 32, as a structured scalar (bytes(...) for its 128 bytes)."""
    from agent_core.runtime.tensor_map import encode
    rows, k = t.shape
    return encode(t.data_ptr(), {"rows": rows, "cols": k, "row_stride": t.stride(0), "box_rows": box_rows,
                                 "box_cols": BK})


def in_global_memory(*maps):
    """The maps' bytes in one device buffer (the kernels that read them through a pointer)."""
    import cupy
    import torch
    return cupy.asarray(torch.frombuffer(bytearray(b"".join(bytes(m) for m in maps)), dtype=torch.uint8).cuda())


def launch_and_time(built, entry, grid, block, smem, args, c, ref, trials):
    """(median ms, worst error against ref) of the compiled kernel launched on args, writing c."""
    import cupy
    import torch
    from agent_core.profile.timing import time_gpu
    fn = cupy.RawModule(path=str(built.path)).get_function(entry)
    fn.max_dynamic_shared_size_bytes = smem

    def go():
        fn(grid, block, args, shared_mem=smem)
    go()
    torch.cuda.synchronize()
    return time_gpu(go, trials=trials).median_ms, (c.double() - ref).abs().max().item()


def run(shapes, configs, split_configs, trials):
    import cupy
    import torch
    from agent_core.profile.timing import time_gpu
    torch.backends.cuda.matmul.allow_tf32 = False
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for M, N, K in shapes:
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(N, K, device="cuda") / K ** 0.5
        hi_a = a.view(torch.int32).bitwise_and(-8192).view(torch.float32)   # truncation; the form's rounding
        hi_b = b.view(torch.int32).bitwise_and(-8192).view(torch.float32)   # does not change the time
        a3 = torch.cat([a - hi_a, hi_a, hi_a], 1).contiguous()
        b3 = torch.cat([hi_b, b - hi_b, hi_b], 1).contiguous()
        ref = (a.double() @ b.double().T)
        torch.backends.cuda.matmul.allow_tf32 = True
        lib = time_gpu(lambda: torch.mm(a3, b3.T), trials=trials).median_ms
        lib_out = torch.mm(a3, b3.T)
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32 = time_gpu(lambda: torch.mm(a, b.T), trials=trials).median_ms
        fp32_err = (torch.mm(a, b.T).double() - ref).abs().max().item()
        flops = 2 * M * N * 3 * K
        print(f"{M}x{N}x{K}: cuBLAS TF32 over the concatenated parts {lib:.3f} ms ({flops / lib / 1e9:.0f} TFLOPS), "
              f"fp32 {fp32:.3f} ms; library error {(lib_out.double() - ref).abs().max().item():.2e}", flush=True)
        for bn, st, cl, persist in configs:
            built = compile_source(source(bn, st, cl), "tma_gemm", arch="sm_90")
            c = torch.full((M, N), float("nan"), device="cuda")
            tiles = -(-(-(-M // BM)) // cl) * -(-N // bn) * cl
            grid = (min(tiles, sms // cl * cl) if persist else tiles,)
            args = (in_global_memory(tensor_map(a3, BM), tensor_map(b3, bn // cl)), cupy.asarray(c), cupy.int32(M),
                    cupy.int32(N), cupy.int32(3 * K))
            ms, err = launch_and_time(built, "tma_gemm", grid, (384,), shared_bytes(bn, st), args, c, ref, trials)
            print(f"  ours 128x{bn}, {st} stages, cluster {cl}, {'persistent ' + str(grid[0]) if persist else 'one tile a CTA'}"
                  f" ({built.registers} registers, {built.spill_stores} B spills): "
                  f"{ms:.3f} ms, {lib / ms:.2f}x the library; error {err:.2e}", flush=True)
        for bn, st, slice_acc, *more in split_configs:
            tma, pw, param_maps = (list(more) + [0, 1, 0][len(more):])[:3]
            built = compile_source(split_source(bn, st, bool(slice_acc), bool(tma), pw, bool(param_maps)), "split_gemm",
                                   arch="sm_90")
            c = torch.full((M, N), float("nan"), device="cuda")
            grid = (-(-M // BM) * -(-N // bn),)
            args = (cupy.asarray(a), cupy.asarray(b), cupy.asarray(c), cupy.int32(M), cupy.int32(N), cupy.int32(K))
            if param_maps:
                args = (tensor_map(a, BM), tensor_map(b, bn)) + args
            elif tma:
                args = (in_global_memory(tensor_map(a, BM), tensor_map(b, bn)),) + args
            ms, err = launch_and_time(built, "split_gemm", grid, (128 * pw + 256,), split_shared_bytes(bn, st), args,
                                      c, ref, trials)
            print(f"  ours split in the kernel, {'TMA' if tma else 'cp.async'}{' (maps by value)' if param_maps else ''}, "
                  f"{pw} producer warpgroup(s), 128x{bn}, {st} stages, "
                  f"{'per-slice sums' if slice_acc else 'one sum'}"
                  f" ({built.registers} registers, {built.spill_stores} B spills): {ms:.3f} ms, {lib / ms:.2f}x the "
                  f"library's GEMM alone; error {err:.2e} (torch fp32 {fp32_err:.2e})", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="4096x4096x4096,8192x8192x8192,4096x4096x1024,394x2048x512")
    ap.add_argument("--configs", default="256:4:1:0,256:4:1:1,256:4:2:0,256:4:2:1,128:6:2:1",
                    help="block_n:stages:cluster:persistent, comma-separated")
    ap.add_argument("--split-configs", default="128:3:1:1,128:3:1:1:2,128:3:1:1:1:1,128:3:1:1:2:1",
                    help="the in-kernel split: block_n:stages:per-slice sums (0 or 1)[:TMA copies (0 or 1)"
                         "[:producer warpgroups[:maps by value (0 or 1)]]], comma-separated")
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    configs = [tuple(int(x) for x in c.split(":")) for c in a.configs.split(",") if c]
    split_configs = [tuple(int(x) for x in c.split(":")) for c in a.split_configs.split(",") if c]
    if a.compile_only:
        for bn, st, cl, _ in configs:
            built = compile_source(source(bn, st, cl), "tma_gemm", arch="sm_90", use_cache=False)
            print(built.summary(), shared_bytes(bn, st), "serialized" if "serializ" in built.log else "")
        for bn, st, sa, *more in split_configs:
            tma, pw, param_maps = (list(more) + [0, 1, 0][len(more):])[:3]
            built = compile_source(split_source(bn, st, bool(sa), bool(tma), pw, bool(param_maps)), "split_gemm",
                                   arch="sm_90", use_cache=False)
            print(built.summary(), split_shared_bytes(bn, st), "serialized" if "serializ" in built.log else "")
        return
    run([tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")], configs, split_configs, a.trials)


if __name__ == "__main__":
    main()
