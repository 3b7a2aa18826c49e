"""The C++/CUDA sources of an export: kernel files with their launchers, the program (entry point and
memory plan), the C API for ctypes, and the host driver.

Everything here is rendered from the schedule and the memory plan; shapes are compile-time constants,
so the sources read like hand-specialised code and a CUDA graph replays them with no argument updates.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..codegen.cuda import Names, describe_node
from ..ir import Program
from ..ops.layout import slice_len
from ..ops.registry import DTYPE_BYTES
from .memory import MemoryPlan
from .steps import Schedule, Step, gemm_dims

# int64 as `long long`, the type the generated kernels use (int64_t is `long` on Linux: not the same type)
C_TYPES = {"float32": "float", "bool": "bool", "int64": "long long", "int32": "int32_t", "uint8": "uint8_t",
           "int8": "int8_t"}
# identifiers stitch_run uses itself
HOST_LOCALS = ("arena", "inputs", "params", "outputs", "workspace", "stream", "cublas", "memory")

_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\([\w, ]+\)\s*(?:__cluster_dims__\([\w, ]+\)\s*)?(\w+)\(([^)]*)\)')


def c_type(dtype: str) -> str:
    if dtype not in C_TYPES:
        raise ValueError(f"dtype {dtype} has no C type in the export")
    return C_TYPES[dtype]


def camel(ident: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in ident.split("_") if p)


@dataclass
class HostNames:
    """C identifiers of the program's values (struct fields and arena pointers share one namespace)."""
    idents: dict[str, str]

    @classmethod
    def of(cls, program: Program) -> "HostNames":
        names = Names()
        names.taken.update(HOST_LOCALS)
        return cls({vid: names.new(program.values[vid].name) for vid in program.values})

    def __getitem__(self, vid: str) -> str:
        return self.idents[vid]


# --- kernel files --------------------------------------------------------------------------------------
def kernel_file(step: Step) -> str:
    """The generated kernel unchanged, plus a host launcher with the schedule as named constants."""
    ks = step.kernel
    m = _SIGNATURE.search(ks.source)
    if m is None or m.group(1) != ks.name:
        raise ValueError(f"kernel {ks.name}: cannot find its extern \"C\" __global__ signature")
    params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    args = [p.split()[-1] for p in params]
    g, b = ks.grid, ks.block
    launcher = [
        "",
        f"// Host launcher: the grid and block this kernel was specialised for.",
        f"cudaError_t launch_{ks.name}({', '.join(params + ['cudaStream_t stream'])}) {{",
        f"  const dim3 grid({g[0]}, {g[1]}, {g[2]});",
        f"  const dim3 block({b[0]}, {b[1]}, {b[2]});",
        f"  constexpr size_t kSharedBytes = {ks.shared_bytes};",
        *(["  // beyond 48 KiB of dynamic shared memory a kernel must opt in (runtime/launch.py does the same)",
           f"  cudaFuncSetAttribute({ks.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSharedBytes);"]
          if ks.shared_bytes > 48 * 1024 else []),
        f"  {ks.name}<<<grid, block, kSharedBytes, stream>>>({', '.join(args)});",
        "  return cudaGetLastError();",
        "}",
    ]
    return '#include "stitch_kernels.h"\n\n' + ks.source.rstrip("\n") + "\n" + "\n".join(launcher) + "\n"


def kernel_params(ks) -> list[tuple[str, str]]:
    """(pointer type, name) of each parameter of a generated kernel, from its signature."""
    m = _SIGNATURE.search(ks.source)
    out = []
    for p in (p.strip() for p in m.group(2).split(",") if p.strip()):
        words = p.split()
        out.append((" ".join(w for w in words[:-1] if w != "__restrict__"), words[-1]))
    return out


def launcher_declaration(step: Step) -> str:
    m = _SIGNATURE.search(step.kernel.source)
    params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    return f"cudaError_t launch_{step.kernel.name}({', '.join(params + ['cudaStream_t stream'])});"


BIAS_KERNEL = """#include "stitch_kernels.h"

// Fills every row of y with the bias row: the C operand of the beta = 1 GEMM that follows, as torch's
// addmm does for linear with a bias.
constexpr int kBiasBlock = 256;
constexpr int kBiasMaxBlocks = 4096;

__global__ void __launch_bounds__(kBiasBlock)
broadcast_bias_rows(float* __restrict__ y, const float* __restrict__ bias, long long rows, int cols) {
  const long long numel = rows * cols;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < numel; i += stride) {
    y[i] = bias[i % cols];
  }
}

cudaError_t launch_broadcast_bias_rows(float* y, const float* bias, long long rows, int cols, cudaStream_t stream) {
  const long long blocks = (rows * cols + kBiasBlock - 1) / kBiasBlock;
  const int grid = (int)(blocks < kBiasMaxBlocks ? blocks : kBiasMaxBlocks);
  if (grid == 0) {
    return cudaSuccess;
  }
  broadcast_bias_rows<<<grid, kBiasBlock, 0, stream>>>(y, bias, rows, cols);
  return cudaGetLastError();
}
"""


def kernels_header(schedule: Schedule, bias: bool) -> str:
    out = ["// Launchers of the generated kernels (one .cu file each under kernels/).", "#pragma once", "",
           "#include <cstddef>", "#include <cstdint>", "#include <cuda_runtime.h>", ""]
    out += [launcher_declaration(s) for s in schedule.steps if s.kind == "kernel"]
    if bias:
        out += ["", "// y[r, :] = bias for every row r (kernels/broadcast_bias_rows.cu)",
                "cudaError_t launch_broadcast_bias_rows(float* y, const float* bias, long long rows, int cols, "
                "cudaStream_t stream);"]
    return "\n".join(out) + "\n"


# --- the program ------------------------------------------------------------------------------------------
class ProgramSource:
    """stitch_program.h / stitch_program.cpp for one schedule and memory plan."""

    def __init__(self, program: Program, schedule: Schedule, memory: MemoryPlan, names: HostNames):
        self.p, self.s, self.m, self.n = program, schedule, memory, names
        self.inputs = list(program.inputs)
        self.params = [v.id for v in program.values.values() if v.role.value in ("parameter", "constant")]
        self.outputs = list(program.outputs)

    def scratch(self) -> list[tuple[str, str, tuple]]:
        """(offset constant, pointer type, memory-plan entry) of each kernel scratch buffer; the
        buffers are the kernel's last parameters, in order, and named after them."""
        out = []
        for step in self.s.steps:
            entries = [e for e in self.m.scratch if e[0] == step.name]
            if not entries:
                continue
            params = kernel_params(step.kernel)[-len(entries):]
            for (ctype, pname), entry in zip(params, entries):
                out.append((f"k{camel(step.name)}{camel(pname)}Offset", ctype, entry))
        return out

    def offset_name(self, vid: str) -> str:
        return f"k{camel(self.n[vid])}Offset"

    def ptr(self, vid: str) -> str:
        b = self.s.base(vid)
        where = self.m.storage[b]
        if where == "input":
            return f"inputs.{self.n[b]}"
        if where == "parameter":
            return f"params.{self.n[b]}"
        if where == "output":
            return f"outputs.{self.n[self.m.output_owner[b]]}"
        return self.n[b]

    def _struct(self, name: str, vids: list[str], const: bool, what: str) -> list[str]:
        out = [f"// {what}: device pointers, contiguous, row-major.", f"struct {name} {{"]
        for v in vids:
            val = self.p.values[v]
            q = "const " if const else ""
            out.append(f"  {q}{c_type(val.dtype)}* {self.n[v]};  // {val.name}: {val.spec}")
        if not vids:
            out.append("  // none")
        return out + ["};", ""]

    def header(self) -> str:
        p, m = self.p, self.m
        out = [f"// {p.name}: the exported program's entry point and memory plan.",
               "// Generated by StitchCUDA.", "#pragma once", "", "#include <cstddef>", "#include <cstdint>",
               "#include <cuda_runtime.h>"]
        if self.s.uses_cublas:
            out.append("#include <cublas_v2.h>")
        out.append("")
        out += self._struct("StitchInputs", self.inputs, True, "Program inputs")
        out += self._struct("StitchParameters", self.params, True, "Parameters and constants")
        out += self._struct("StitchOutputs", self.outputs, False, "Program outputs, written by stitch_run")
        out += ["// The workspace: one arena that holds every intermediate value. Values whose lifetimes",
                "// (first write to last read, counted in launches) do not overlap share bytes.",
                "namespace stitch_memory {", ""]
        for b in sorted(m.arena.values(), key=lambda x: (x.offset, x.value_id)):
            val = p.values[b.value_id]
            out.append(f"constexpr size_t {self.offset_name(b.value_id)} = {b.offset};  // {val.name} "
                       f"{val.spec}, {b.nbytes} bytes, live in launches {b.first}..{b.last}")
        for name, _ctype, (_k, dtype, n, off) in self.scratch():
            out.append(f"constexpr size_t {name} = {off};  // {n} x {dtype}, zeroed once")
        out += [f"constexpr size_t kActivationBytes = {m.activation_bytes};  // {m.unshared_bytes} without sharing",
                f"constexpr size_t kWorkspaceBytes = {m.arena_bytes};", "", "}  // namespace stitch_memory", ""]
        cublas = "cublasHandle_t cublas, " if self.s.uses_cublas else ""
        out += ["// Runs the program on `stream`. The workspace holds stitch_memory::kWorkspaceBytes bytes,",
                "// 256-byte aligned, zeroed before the first call and passed unchanged to every call",
                "// (split reductions keep their arrival counters there and leave them zeroed).",
                "// Returns 0, or a CUDA / cuBLAS status; stitch_last_error() says which call failed.",
                "// Nothing in it synchronises or allocates, so it can be captured into a CUDA graph."]
        if self.s.uses_cublas:
            out.append("// `cublas` must come from stitch_cublas_create (fp32 math, no TF32).")
        out += [f"int stitch_run(const StitchInputs& inputs, const StitchParameters& params, "
                f"const StitchOutputs& outputs,", f"               void* workspace, {cublas}cudaStream_t stream);",
                "", "const char* stitch_last_error();"]
        if self.s.uses_cublas:
            out += ["", "// A cuBLAS handle with CUBLAS_DEFAULT_MATH: full fp32, no TF32 (as torch with allow_tf32 off).",
                    "int stitch_cublas_create(cublasHandle_t* handle);"]
        return "\n".join(out) + "\n"

    def source(self) -> str:
        p, m = self.p, self.m
        out = [f"// {p.name}: the launch sequence of the exported program (see README.md).",
               "// Generated by StitchCUDA.", '#include "stitch_program.h"', '#include "stitch_kernels.h"', "",
               "#include <string>", "", "namespace {", "", "thread_local std::string last_error;", "",
               "int fail(int status, const char* call) {",
               "  last_error = std::string(call) + \" failed with status \" + std::to_string(status);",
               "  return status;", "}", "", "}  // namespace", "",
               "#define STITCH_CHECK_CUDA(call)                                      \\",
               "  do {                                                               \\",
               "    const cudaError_t status_ = (call);                              \\",
               "    if (status_ != cudaSuccess) return fail((int)status_, #call);    \\",
               "  } while (0)", ""]
        if self.s.uses_cublas:
            out += ["#define STITCH_CHECK_CUBLAS(call)                                    \\",
                    "  do {                                                               \\",
                    "    const cublasStatus_t status_ = (call);                           \\",
                    "    if (status_ != CUBLAS_STATUS_SUCCESS) return fail((int)status_, #call); \\",
                    "  } while (0)", "",
                    "namespace {", "",
                    "// alpha and beta of the GEMMs (host pointer mode)",
                    "constexpr float kOne = 1.0f;"] + (["constexpr float kZero = 0.0f;"] if self._beta_zero() else []) + ["",
                    "}  // namespace", "",
                    "int stitch_cublas_create(cublasHandle_t* handle) {",
                    "  STITCH_CHECK_CUBLAS(cublasCreate(handle));",
                    "  STITCH_CHECK_CUBLAS(cublasSetMathMode(*handle, CUBLAS_DEFAULT_MATH));",
                    "  return 0;", "}", ""]
        out += ["const char* stitch_last_error() {", "  return last_error.c_str();", "}", ""]
        cublas = "cublasHandle_t cublas, " if self.s.uses_cublas else ""
        out += [f"int stitch_run(const StitchInputs& inputs, const StitchParameters& params, "
                f"const StitchOutputs& outputs,", f"               void* workspace, {cublas}cudaStream_t stream) {{"]
        if m.arena or m.scratch:
            out.append("  unsigned char* const arena = static_cast<unsigned char*>(workspace);")
        else:
            out.append("  static_cast<void>(workspace);  // this program keeps no intermediate values")
        for b in sorted(m.arena.values(), key=lambda x: (x.first, x.value_id)):
            ct = c_type(p.values[b.value_id].dtype)
            out.append(f"  {ct}* const {self.n[b.value_id]} = reinterpret_cast<{ct}*>(arena + "
                       f"stitch_memory::{self.offset_name(b.value_id)});")
        if self.s.uses_cublas:
            out.append("  STITCH_CHECK_CUBLAS(cublasSetStream(cublas, stream));")
        for i, step in enumerate(self.s.steps):
            out.append("")
            out += [f"  {line}" for line in self._step(i, step)]
        for vid, src in m.output_copies:
            val = p.values[vid]
            out += ["", f"  // {val.name} is {p.values[src].name} itself: copied into the output buffer",
                    f"  STITCH_CHECK_CUDA(cudaMemcpyAsync(outputs.{self.n[vid]}, {self.ptr(src)}, {val.nbytes}, "
                    f"cudaMemcpyDeviceToDevice, stream));"]
        out += ["  return 0;", "}"]
        return "\n".join(out) + "\n"

    def _beta_zero(self) -> bool:
        """Some GEMM overwrites its result (no bias to accumulate onto)."""
        return any(s.kind == "gemm" and not gemm_dims(self.p, s.node)["bias"] for s in self.s.steps)

    def _step(self, i: int, step: Step) -> list[str]:
        head = f"// launch {i}, region {step.region_id}: {step.reason}"
        if step.kind == "kernel":
            ks = step.kernel
            args = [self.ptr(v) for v in ks.inputs] + [self.ptr(v) for v in ks.outputs]
            for name, ctype, (kname, *_rest) in self.scratch():
                if kname == step.name:
                    args.append(f"reinterpret_cast<{ctype}>(arena + stitch_memory::{name})")
            return [head, f"STITCH_CHECK_CUDA(launch_{ks.name}({', '.join(args + ['stream'])}));"]
        if step.kind == "gemm":
            return [head] + self._gemm(step)
        return [head] + self._copy(step)

    def _gemm(self, step: Step) -> list[str]:
        p = self.p
        node = p.nodes[step.node]
        d = gemm_dims(p, step.node)
        a, b = self.ptr(node.inputs[0]), self.ptr(node.inputs[1])
        c = self.ptr(node.outputs[0])
        out = ["{", f"  // {describe_node(p, node.id)}"]
        if d["transpose_b"]:
            out.append("  // row-major y = x @ W^T is column-major y^T = W x^T: W transposed, x as it is")
        else:
            out.append("  // row-major c = a @ b is column-major c^T = b^T a^T: swap the operands, no transposes")
        out.append(f"  constexpr int kM = {d['m']};  // rows of the result")
        out.append(f"  constexpr int kN = {d['n']};  // columns of the result")
        out.append(f"  constexpr int kK = {d['k']};  // the reduced dimension")
        beta = "kZero"
        if d["bias"]:
            out.append(f"  STITCH_CHECK_CUDA(launch_broadcast_bias_rows({c}, {self.ptr(node.inputs[2])}, kM, kN, stream));")
            beta = "kOne"
        op_b = "CUBLAS_OP_T" if d["transpose_b"] else "CUBLAS_OP_N"
        ld_b = "kK" if d["transpose_b"] else "kN"
        if d["batch"] == 1:
            out.append(f"  STITCH_CHECK_CUBLAS(cublasSgemm(cublas, {op_b}, CUBLAS_OP_N, kN, kM, kK, &kOne, {b}, {ld_b},")
            out.append(f"                                  {a}, kK, &{beta}, {c}, kN));")
        else:
            out.append(f"  constexpr int kBatch = {d['batch']};")
            out.append(f"  constexpr long long kStrideA = {d['stride_a']};  // elements between batches (0: shared)")
            out.append(f"  constexpr long long kStrideB = {d['stride_b']};")
            out.append(f"  constexpr long long kStrideC = {d['stride_c']};")
            out.append(f"  STITCH_CHECK_CUBLAS(cublasSgemmStridedBatched(cublas, {op_b}, CUBLAS_OP_N, kN, kM, kK, &kOne,")
            out.append(f"                                                {b}, {ld_b}, kStrideB, {a}, kK, kStrideA,")
            out.append(f"                                                &{beta}, {c}, kN, kStrideC, kBatch));")
        return out + ["}"]

    def _copy(self, step: Step) -> list[str]:
        p = self.p
        node = p.nodes[step.node]
        out_val = p.values[node.outputs[0]]
        esize = DTYPE_BYTES[out_val.dtype]
        rank = len(out_val.shape)
        dim = node.attrs.get("dim", 0) % rank
        outer = math.prod(out_val.shape[:dim])
        inner = math.prod(out_val.shape[dim + 1:])
        dst = self.ptr(node.outputs[0])
        lines = ["{", f"  // {describe_node(p, node.id)}",
                 f"  constexpr size_t kRows = {outer};  // product of the dims before dim {dim}"]
        if node.op == "slice":
            src_val = p.values[node.inputs[0]]
            size = src_val.shape[dim]
            start = range(*slice(node.attrs.get("start"), node.attrs.get("end"), 1).indices(size)).start
            length = slice_len(size, node.attrs.get("start"), node.attrs.get("end"), 1)
            lines += [f"  constexpr size_t kRowBytes = {length * inner * esize};  // the kept part of each row",
                      f"  constexpr size_t kSourcePitch = {size * inner * esize};",
                      f"  constexpr size_t kSourceStart = {start * inner * esize};  // bytes",
                      f"  const unsigned char* const source = reinterpret_cast<const unsigned char*>({self.ptr(node.inputs[0])});",
                      f"  STITCH_CHECK_CUDA(cudaMemcpy2DAsync({dst}, kRowBytes, source + kSourceStart, kSourcePitch, "
                      f"kRowBytes, kRows, cudaMemcpyDeviceToDevice, stream));"]
        else:
            total = out_val.shape[dim]
            lines += [f"  constexpr size_t kPitch = {total * inner * esize};  // bytes per output row",
                      f"  unsigned char* const target = reinterpret_cast<unsigned char*>({dst});"]
            at = 0
            for k, v in enumerate(node.inputs):
                part = p.values[v].shape[dim]
                lines.append(f"  STITCH_CHECK_CUDA(cudaMemcpy2DAsync(target + {at * inner * esize}, kPitch, "
                             f"{self.ptr(v)}, {part * inner * esize}, {part * inner * esize}, kRows, "
                             f"cudaMemcpyDeviceToDevice, stream));  // {p.values[v].name}")
                at += part
        return lines + ["}"]
