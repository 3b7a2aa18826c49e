"""The host driver (main.cpp) and the C API the Python binding calls (stitch_capi.cpp).

Both are plain C++ over the CUDA runtime API (no device code), so the host compiler builds them."""
from __future__ import annotations

from ..ir import Program
from .host import ProgramSource, c_type

TOLERANCE = 1e-4  # atol = rtol, KernelBench's fp32 tolerance and verify.py's


def _table(name: str, rows: list[tuple[str, str, int, bool]]) -> list[str]:
    """A constexpr array of TensorFile rows; nothing when there are none (C++ has no empty arrays)."""
    if not rows:
        return []
    out = [f"constexpr TensorFile {name}[] = {{"]
    out += [f'    {{"{n}", "{path}", {nbytes}, {"true" if is_float else "false"}}},' for n, path, nbytes, is_float in rows]
    return out + ["};", ""]


def driver_source(program: Program, src: ProgramSource, files: dict[str, str]) -> str:
    """main.cpp: load data/, run, check against the reference outputs, time with CUDA events."""
    p, n = program, src.n

    def rows(vids):
        return [(p.values[v].name, files[v], p.values[v].nbytes, p.values[v].dtype == "float32") for v in vids]
    cublas = src.s.uses_cublas
    out = [f"// Host driver of {p.name}: loads inputs and parameters from DATA_DIR (see manifest.json), runs",
           "// the program, checks every output against the saved reference within atol = rtol = 1e-4,",
           "// and times it with CUDA events. Exit status: 0 outputs match, 1 mismatch, 2 usage or I/O error.",
           "//",
           "//   stitch_driver DATA_DIR [--graph] [--runs N]",
           "//",
           "// --graph captures the program into a CUDA graph once and replays it.",
           '#include "stitch_program.h"', "",
           "#include <cmath>", "#include <cstdio>", "#include <cstdlib>", "#include <cstring>", "#include <fstream>",
           "#include <string>", "#include <vector>", "", "namespace {", "",
           f"constexpr double kAbsTolerance = {TOLERANCE};", f"constexpr double kRelTolerance = {TOLERANCE};",
           "constexpr int kWarmupRuns = 3;", "constexpr int kDefaultTimedRuns = 100;",
           "constexpr size_t kMismatchesShown = 5;", "constexpr int kExitMismatch = 1;", "constexpr int kExitError = 2;", "",
           "// One tensor's file under DATA_DIR: raw little-endian bytes, row-major.",
           "struct TensorFile {", "  const char* name;", "  const char* path;", "  size_t bytes;",
           "  bool is_float;  // float32 is compared with the tolerance, anything else bit for bit", "};", ""]
    out += _table("kInputFiles", rows(src.inputs))
    out += _table("kParameterFiles", rows(src.params))
    out += _table("kReferenceFiles", [(p.values[v].name, files["ref:" + v], p.values[v].nbytes,
                                       p.values[v].dtype == "float32") for v in src.outputs])
    out += [
        "void check_cuda(cudaError_t status, const char* what) {",
        "  if (status != cudaSuccess) {",
        '    std::fprintf(stderr, "stitch_driver: %s: %s\\n", what, cudaGetErrorString(status));',
        "    std::exit(kExitError);", "  }", "}", "",
        "void check_run(int status) {",
        "  if (status != 0) {",
        '    std::fprintf(stderr, "stitch_driver: stitch_run: %s\\n", stitch_last_error());',
        "    std::exit(kExitError);", "  }", "}", "",
        "std::vector<unsigned char> read_file(const std::string& dir, const TensorFile& file) {",
        "  const std::string path = dir + \"/\" + file.path;",
        "  std::ifstream in(path, std::ios::binary | std::ios::ate);",
        "  if (!in) {",
        '    std::fprintf(stderr, "stitch_driver: cannot open %s (%s)\\n", path.c_str(), file.name);',
        "    std::exit(kExitError);", "  }",
        "  const std::streamsize size = in.tellg();",
        "  if (size != (std::streamsize)file.bytes) {",
        '    std::fprintf(stderr, "stitch_driver: %s has %lld bytes, expected %zu\\n", path.c_str(), (long long)size, file.bytes);',
        "    std::exit(kExitError);", "  }",
        "  std::vector<unsigned char> bytes(file.bytes);",
        "  in.seekg(0);",
        "  in.read(reinterpret_cast<char*>(bytes.data()), size);",
        "  return bytes;", "}", "",
        "void* upload(const std::string& dir, const TensorFile& file) {",
        "  const std::vector<unsigned char> bytes = read_file(dir, file);",
        "  void* device = nullptr;",
        "  check_cuda(cudaMalloc(&device, file.bytes > 0 ? file.bytes : 1), file.name);",
        "  check_cuda(cudaMemcpy(device, bytes.data(), file.bytes, cudaMemcpyHostToDevice), file.name);",
        "  return device;", "}", "",
        "// Elements of one output outside |got - want| <= atol + rtol * |want| (NaN must meet NaN).",
        "size_t count_mismatches(const TensorFile& file, const std::vector<unsigned char>& got,",
        "                        const std::vector<unsigned char>& want) {",
        "  if (!file.is_float) {",
        "    size_t bad = 0;",
        "    for (size_t i = 0; i < file.bytes; ++i) bad += got[i] != want[i];",
        "    return bad;", "  }",
        "  const float* g = reinterpret_cast<const float*>(got.data());",
        "  const float* w = reinterpret_cast<const float*>(want.data());",
        "  size_t bad = 0;",
        "  for (size_t i = 0; i < file.bytes / sizeof(float); ++i) {",
        "    const bool both_nan = std::isnan(g[i]) && std::isnan(w[i]);",
        "    const double err = std::fabs((double)g[i] - (double)w[i]);",
        "    if (!both_nan && !(err <= kAbsTolerance + kRelTolerance * std::fabs((double)w[i]))) {",
        "      if (bad < kMismatchesShown) {",
        '        std::fprintf(stderr, "  %s[%zu]: got %.9g, reference %.9g\\n", file.name, i, g[i], w[i]);',
        "      }",
        "      ++bad;", "    }", "  }",
        "  return bad;", "}", "", "}  // namespace", "",
        "int main(int argc, char** argv) {",
        "  if (argc < 2) {",
        '    std::fprintf(stderr, "usage: %s DATA_DIR [--graph] [--runs N]\\n", argv[0]);',
        "    return kExitError;", "  }",
        "  const std::string dir = argv[1];",
        "  bool use_graph = false;",
        "  int timed_runs = kDefaultTimedRuns;",
        "  for (int i = 2; i < argc; ++i) {",
        '    if (std::strcmp(argv[i], "--graph") == 0) {',
        "      use_graph = true;",
        '    } else if (std::strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {',
        "      timed_runs = std::atoi(argv[++i]);",
        "    } else {",
        '      std::fprintf(stderr, "stitch_driver: unknown argument %s\\n", argv[i]);',
        "      return kExitError;", "    }", "  }",
        "  if (timed_runs < 1) {",
        '    std::fprintf(stderr, "stitch_driver: --runs needs a positive count\\n");',
        "    return kExitError;", "  }", "",
        "  std::vector<void*> device_inputs, device_params, device_outputs;",
        *(["  for (const TensorFile& file : kInputFiles) device_inputs.push_back(upload(dir, file));"]
          if src.inputs else []),
        *(["  for (const TensorFile& file : kParameterFiles) device_params.push_back(upload(dir, file));"]
          if src.params else []),
        "  for (const TensorFile& file : kReferenceFiles) {",
        "    void* device = nullptr;",
        "    check_cuda(cudaMalloc(&device, file.bytes > 0 ? file.bytes : 1), file.name);",
        "    device_outputs.push_back(device);", "  }",
        "  StitchInputs inputs{};"]
    out += [f"  inputs.{n[v]} = static_cast<const {c_type(p.values[v].dtype)}*>(device_inputs[{i}]);"
            for i, v in enumerate(src.inputs)]
    out.append("  StitchParameters params{};")
    out += [f"  params.{n[v]} = static_cast<const {c_type(p.values[v].dtype)}*>(device_params[{i}]);"
            for i, v in enumerate(src.params)]
    out.append("  StitchOutputs outputs{};")
    out += [f"  outputs.{n[v]} = static_cast<{c_type(p.values[v].dtype)}*>(device_outputs[{i}]);"
            for i, v in enumerate(src.outputs)]
    run_args = "inputs, params, outputs, workspace, " + ("cublas, " if cublas else "") + "stream"
    out += [
        "", "  void* workspace = nullptr;",
        "  check_cuda(cudaMalloc(&workspace, stitch_memory::kWorkspaceBytes > 0 ? stitch_memory::kWorkspaceBytes : 1), \"workspace\");",
        "  check_cuda(cudaMemset(workspace, 0, stitch_memory::kWorkspaceBytes), \"workspace\");",
        "  cudaStream_t stream = nullptr;",
        "  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), \"stream\");"]
    if cublas:
        out += ["  cublasHandle_t cublas = nullptr;", "  check_run(stitch_cublas_create(&cublas));"]
    out += [
        "",
        "  // one plain run first: module loading and cuBLAS set-up happen outside any graph capture",
        f"  check_run(stitch_run({run_args}));",
        "  check_cuda(cudaStreamSynchronize(stream), \"first run\");",
        "  cudaGraphExec_t graph_exec = nullptr;",
        "  if (use_graph) {",
        "    cudaGraph_t graph = nullptr;",
        "    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), \"capture\");",
        f"    check_run(stitch_run({run_args}));",
        "    check_cuda(cudaStreamEndCapture(stream, &graph), \"capture\");",
        "    check_cuda(cudaGraphInstantiate(&graph_exec, graph, 0), \"graph instantiate\");",
        "    check_cuda(cudaGraphDestroy(graph), \"graph\");",
        "  }",
        "  auto run_once = [&]() {",
        "    if (use_graph) {",
        "      check_cuda(cudaGraphLaunch(graph_exec, stream), \"graph launch\");",
        "    } else {",
        f"      check_run(stitch_run({run_args}));",
        "    }", "  };",
        "  for (int i = 0; i < kWarmupRuns; ++i) run_once();",
        "  cudaEvent_t start = nullptr, stop = nullptr;",
        "  check_cuda(cudaEventCreate(&start), \"event\");",
        "  check_cuda(cudaEventCreate(&stop), \"event\");",
        "  check_cuda(cudaEventRecord(start, stream), \"event\");",
        "  for (int i = 0; i < timed_runs; ++i) run_once();",
        "  check_cuda(cudaEventRecord(stop, stream), \"event\");",
        "  check_cuda(cudaEventSynchronize(stop), \"timing\");",
        "  float total_ms = 0.0f;",
        "  check_cuda(cudaEventElapsedTime(&total_ms, start, stop), \"timing\");",
        '  std::printf("time: %.4f ms per run (%d runs, %s)\\n", total_ms / timed_runs, timed_runs,',
        '              use_graph ? "CUDA graph replay" : "stream launches");',
        "",
        "  // outputs are checked after the timed runs: repeated runs and graph replays must keep them",
        "  size_t mismatches = 0;",
        "  for (size_t i = 0; i < device_outputs.size(); ++i) {",
        "    const std::vector<unsigned char> want = read_file(dir, kReferenceFiles[i]);",
        "    std::vector<unsigned char> got(kReferenceFiles[i].bytes);",
        "    check_cuda(cudaMemcpy(got.data(), device_outputs[i], got.size(), cudaMemcpyDeviceToHost), kReferenceFiles[i].name);",
        "    const size_t bad = count_mismatches(kReferenceFiles[i], got, want);",
        '    std::printf("output %s: %s\\n", kReferenceFiles[i].name, bad == 0 ? "matches the reference" : "MISMATCH");',
        "    mismatches += bad;", "  }", "",
        "  if (graph_exec != nullptr) check_cuda(cudaGraphExecDestroy(graph_exec), \"graph\");"]
    if cublas:
        out.append("  cublasDestroy(cublas);")
    out += [
        "  cudaEventDestroy(start);", "  cudaEventDestroy(stop);", "  cudaStreamDestroy(stream);",
        "  cudaFree(workspace);",
        "  for (void* ptr : device_inputs) cudaFree(ptr);",
        "  for (void* ptr : device_params) cudaFree(ptr);",
        "  for (void* ptr : device_outputs) cudaFree(ptr);",
        "  if (mismatches > 0) {",
        '    std::fprintf(stderr, "stitch_driver: %zu element(s) differ from the reference\\n", mismatches);',
        "    return kExitMismatch;", "  }",
        "  return 0;", "}"]
    return "\n".join(out) + "\n"


def capi_source(program: Program, src: ProgramSource) -> str:
    """stitch_capi.cpp: a flat extern "C" entry point over pointer arrays, for ctypes."""
    p, n = program, src.n
    cublas = src.s.uses_cublas
    out = [f"// C API of {p.name} for ctypes (python/stitch_program.py): pointer arrays in manifest order.",
           '#include "stitch_program.h"', ""]
    if cublas:
        out += ["namespace {", "",
                "// One cuBLAS handle per calling thread, created on first use (handles are not thread-safe).",
                "int thread_cublas(cublasHandle_t* handle) {",
                "  thread_local cublasHandle_t cached = nullptr;",
                "  if (cached == nullptr) {",
                "    const int status = stitch_cublas_create(&cached);",
                "    if (status != 0) return status;", "  }",
                "  *handle = cached;", "  return 0;", "}", "", "}  // namespace", ""]
    out += ['extern "C" {', "",
            "size_t stitch_workspace_bytes() {", "  return stitch_memory::kWorkspaceBytes;", "}", "",
            "const char* stitch_error() {", "  return stitch_last_error();", "}", "",
            "int stitch_run_packed(void* const* input_ptrs, void* const* param_ptrs, void* const* output_ptrs,",
            "                      void* workspace, void* stream) {"]
    out.append("  StitchInputs inputs{};")
    out += [f"  inputs.{n[v]} = static_cast<const {c_type(p.values[v].dtype)}*>(input_ptrs[{i}]);"
            for i, v in enumerate(src.inputs)]
    out.append("  StitchParameters params{};")
    out += [f"  params.{n[v]} = static_cast<const {c_type(p.values[v].dtype)}*>(param_ptrs[{i}]);"
            for i, v in enumerate(src.params)]
    out.append("  StitchOutputs outputs{};")
    out += [f"  outputs.{n[v]} = static_cast<{c_type(p.values[v].dtype)}*>(output_ptrs[{i}]);"
            for i, v in enumerate(src.outputs)]
    if not src.inputs:
        out.append("  static_cast<void>(input_ptrs);")
    if not src.params:
        out.append("  static_cast<void>(param_ptrs);")
    if cublas:
        out += ["  cublasHandle_t cublas = nullptr;", "  const int status = thread_cublas(&cublas);",
                "  if (status != 0) return status;",
                "  return stitch_run(inputs, params, outputs, workspace, cublas, static_cast<cudaStream_t>(stream));"]
    else:
        out.append("  return stitch_run(inputs, params, outputs, workspace, static_cast<cudaStream_t>(stream));")
    out += ["}", "", '}  // extern "C"']
    return "\n".join(out) + "\n"
