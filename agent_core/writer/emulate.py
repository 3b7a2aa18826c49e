"""CpuExecutor: a proposed CUDA kernel compiled by g++ and run on the CPU, so the gate's checks run
on machines without a GPU.

How: the source is scanned for what the shim cannot run (inline asm, cooperative groups, wgmma,
cp.async, textures, half and bfloat16 types, ...: ExecutionError "unsupported" naming it, before any
compiling); a few line-preserving rewrites adapt it (`extern __shared__ T a[]` becomes a pointer to the
block's dynamic shared memory, `__shared__ T a[N]` a reference to the block's own copy, the CUDA
headers and fixed-width typedefs the shim already provides are dropped); then g++ -O1 -std=c++20
compiles it with `-include emulate_shim.h` and a generated `main`, linked against the shim's runtime
object (fibers, scheduler, collectives and driver, compiled once at -O2). Executables are cached by the
hash of everything that went into them, under the user cache dir beside the NVRTC cubins.

The executable is the child: it reads the argument buffers (executors.py's file format), runs every
call in order in one process (so `__device__` globals keep their values between calls, as in a
loaded module), the blocks one after another (a block that spin-waits with __nanosleep on another
block's writes yields, and the next one starts beside it, with its own fibers and shared memory), and
writes each call's buffers back. A block's CUDA threads are fibers on ONE OS thread (emulate_shim.h):
each runs until it reaches __syncthreads, a warp collective or its end, then the next that can go
runs, in thread order, so a run gives the same result every time (atomics too). A kernel whose source
names no barrier, warp collective or shared memory runs its threads as a plain loop, with no
switching at all.

Measured on this project's 2-core AMD EPYC VM (whole CpuExecutor.run: buffers written, child,
buffers read; compiling excluded), before (an OS thread per CUDA thread, barriers on condition
variables) and after:
- block softmax, 4 x 300, 128-thread blocks, 1 call: 0.117 s -> 0.012 s (mostly process start);
- block softmax, 256 x 1024, 1 block of 128 per row, 4 calls: 23.5 s -> 0.20-0.33 s;
- the same at 4096 x 1024 (a real region: 16384 blocks): about 6 min (extrapolated; past the gate's
  60 s it was reported as a "hang") -> 3.7-5.1 s, of which the child is 2.4 s (about 35 ns per
  collective per thread) and the rest moving 128 MB of buffers through files;
- softmax 512 x 1024 with 1024-thread blocks, 4 calls: 2.4 s;
- pointwise float4, 4M floats, 4096 blocks of 256, 4 calls: about 150 s (9 ms a block, extrapolated
  from 256 blocks) -> 0.37-0.66 s as a plain loop (0.63-0.94 s when forced onto fibers).
From these, the work caps below (thread runs = blocks x threads x calls): beyond them a run is
refused as "unsupported" (it is checked on a GPU) rather than timed out as a "hang".

A g++ error is "unsupported" with its first line; a crash (SIGSEGV from a wild write, a stack
overflow, an abort) is "fault" with the signal and the thread; threads that wait for each other
forever are a "hang" said at once (deadlock), and the timeout a "hang" that says it did not finish.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..codegen.kernel import KernelSource
from ..compiler import cache_dir
from .executors import ExecutionError, check_launch, read_buffers, run_child, signal_name, write_buffers

SHIM = Path(__file__).with_name("emulate_shim.h")
# -fstack-clash-protection: a frame bigger than a page touches every page, so local arrays too big
# for a fiber's stack hit its guard page (a clear crash) instead of the next fiber's stack
FLAGS = ("-O1", "-std=c++20", "-fno-strict-aliasing", "-fstack-clash-protection", "-w")
RUNTIME_FLAGS = ("-O2",)      # the scheduler and the collectives run millions of times a second; compiled once
COMPILE_TIMEOUT_S = 120.0

# (pattern, what the user reads); searched in the source without comments (strings kept: asm text)
UNSUPPORTED = [
    (r"\b(?:asm|__asm__|__asm)\b", "inline asm (asm volatile)"),
    (r"\bcooperative_groups\b|\bcg::", "cooperative_groups"),
    (r"\bwgmma\b", "wgmma"),
    (r"\bcp\.async\b|\b__pipeline_\w+|\bmemcpy_async\b", "cp.async / memcpy_async pipelines"),
    (r"\b(?:tex[123]D\w*|texture\s*<|cudaTextureObject_t|surf[123]D\w*|cudaSurfaceObject_t)",
     "textures and surfaces"),
    (r"\b(?:__nv_bfloat16\d*|__half2?|__nv_fp8\w*)\b|cuda_(?:fp16|bf16|fp8)\.h", "half, bfloat16 and fp8 types"),
    (r"\bwmma::|\bnvcuda::|<mma\.h>", "wmma tensor-core fragments"),
    (r"\b(?:__cluster_dims__|clusterDim|clusterIdx|cluster_ctarank)\b", "thread block clusters"),
    (r"\bCUtensorMap\b|\bcp\.async\.bulk", "TMA tensor maps"),
    (r"<<<", "device-side kernel launches"),
    (r"\bcuda::", "libcu++ (cuda::)"),
    (r"\bcuda[A-Z]\w*\s*\(", "CUDA runtime API calls"),
]

_CUDA_HEADERS = re.compile(
    r'^[ \t]*#[ \t]*include\s*[<"](?:cuda_runtime(?:_api)?|cuda|device_launch_parameters|math_constants|'
    r'vector_types|device_functions|cuda_device_runtime_api|sm_\d+_intrinsics)\.h[>"].*$', re.M)
_INT_NAME = r"(?:u?int(?:8|16|32|64)_t|size_t)"
_FIXED_WIDTH_TYPEDEF = re.compile(rf"^[ \t]*(?:typedef[ \t]+[\w \t]+?[ \t]+{_INT_NAME}|"
                                  rf"using[ \t]+{_INT_NAME}[ \t]*=[ \t]*[\w \t]+?)[ \t]*;[ \t]*$", re.M)
_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\s+(?P<decl>[^;\[\]{}]*?)\s*\b(?P<name>\w+)\s*\[\s*\]\s*;")
_ALIGN = re.compile(r"\b__align__\s*\(\s*\d+\s*\)|\balignas\s*\(\s*\d+\s*\)|"
                    r"__attribute__\s*\(\(\s*aligned\s*\(\s*\d+\s*\)\s*\)\)")
_STATIC_SHARED = re.compile(r"\bstatic\s+__shared__\b|\b__shared__\s+static\b")
# `__shared__ [__align__(n)] T name[A][B];`: one declarator, its type a run of names (templates with no
# comma), optional array bounds
_SHARED_DECL = re.compile(r"\b__shared__\s+(?P<align>(?:__align__\s*\(\s*\d+\s*\)\s*)?)"
                          r"(?P<type>(?:[A-Za-z_][\w:<>]*\s+)*?[A-Za-z_][\w:<>]*(?:\s*\*)?)\s*"
                          r"\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\];,]*\]\s*)*);")
# what makes a block's threads wait for each other (or share memory): then they run as fibers, else a loop
_COLLECTIVE = re.compile(r"\b(?:__syncthreads\w*|__syncwarp|__activemask|__shared__|\w+_sync)\b")

# the generated main: every parameter a pointer, called with the argument buffers (guard bytes in)
DRIVER = """
namespace stitch_emu_driver {
template <class T> struct is_pointer { static constexpr bool value = false; };
template <class T> struct is_pointer<T*> { static constexpr bool value = true; };
template <class A> A pass(void* p) {
    static_assert(is_pointer<A>::value,
                  "every kernel parameter must be a device pointer: a launch passes only buffers");
    return static_cast<A>(p);
}
template <unsigned long... I> struct seq {};
template <class... A, unsigned long... I>
void call(void (*f)(A...), void* const* a, seq<I...>) { f(pass<A>(a[I])...); }
template <class... A> constexpr int arity(void (*)(A...)) { return sizeof...(A); }
template <class... A>
void invoke(void (*f)(A...), void* const* a) { call(f, a, seq<__integer_pack(sizeof...(A))...>{}); }
void thunk(void* const* a) { invoke(&KERNEL_NAME, a); }
}  // namespace stitch_emu_driver
int main(int argc, char** argv) {
    return stitch_emu::driver_main(argc, argv, stitch_emu_driver::arity(&KERNEL_NAME), &stitch_emu_driver::thunk,
                                   COLLECTIVES);
}
"""


def strip_comments(source: str) -> str:
    """The source with comments blanked (newlines kept, so line numbers stay); strings are kept."""
    def blank(m: re.Match) -> str:
        text = m.group(0)
        return text if text[0] in "\"'" else re.sub(r"[^\n]", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', blank, source, flags=re.S)


def unsupported_construct(source: str) -> tuple[str, int, str] | None:
    """(construct, line number, line text) of the first thing the shim cannot run, or None."""
    code = strip_comments(source)
    found = []
    for pattern, what in UNSUPPORTED:
        if m := re.search(pattern, code):
            found.append((m.start(), what))
    if not found:
        return None
    pos, what = min(found)
    line = code.count("\n", 0, pos) + 1
    return what, line, source.splitlines()[line - 1].strip()


def uses_collectives(source: str) -> bool:
    """Whether any thread of a block may wait for another: a barrier, a warp collective, shared memory."""
    return _COLLECTIVE.search(strip_comments(source)) is not None


def rewrite(source: str) -> str:
    """The line-preserving rewrites that adapt a CUDA source to the shim."""
    code = strip_comments(source)
    code = _CUDA_HEADERS.sub("", code)
    code = _FIXED_WIDTH_TYPEDEF.sub("", code)

    def dynamic(m: re.Match) -> str:
        decl = " ".join(_ALIGN.sub(" ", m.group("decl")).split())
        return (f"{decl}* {m.group('name')} = reinterpret_cast<{decl}*>(stitch_emu::block_dynamic());"
                + "\n" * m.group(0).count("\n"))

    def per_block(m: re.Match) -> str:
        # the running block's own copy, found by the address of a static key of this declaration
        t, k, name = f"stitch_t_{m.group('name')}", f"stitch_k_{m.group('name')}", m.group("name")
        align = re.search(r"\d+", m.group("align") or "16").group(0)
        return (f"typedef {m.group('type')} {t}{m.group('dims')}; static char {k}; "
                f"{t}& {name} = *static_cast<{t}*>(stitch_emu::block_static(&{k}, sizeof({t}), "
                f"alignof({t}) > {align} ? alignof({t}) : {align}));" + "\n" * m.group(0).count("\n"))
    code = _EXTERN_SHARED.sub(dynamic, code)
    code = _STATIC_SHARED.sub("__shared__", code)
    code = _SHARED_DECL.sub(per_block, code)
    return re.sub(r"\b__noinline__\b", "__attribute__((noinline))", code)


@lru_cache(maxsize=1)
def gxx() -> str:
    path = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("g++")
    if path is None:
        raise ExecutionError("unsupported", "the CPU emulator needs g++, which is not on PATH")
    return path


@lru_cache(maxsize=1)
def gxx_version() -> str:
    return subprocess.run([gxx(), "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def emulate_cache_dir() -> Path:
    path = cache_dir().parent / "emulated"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()


def _compile(cmd: list[str], target: Path, what: str) -> None:
    """Run g++ into a temporary name, then move it into place (parallel runs never see half a file)."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        proc = subprocess.run(cmd + ["-o", str(tmp)], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ExecutionError("unsupported", f"{what}: g++ ran past {COMPILE_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = proc.stderr.splitlines()
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else f"g++ exit {proc.returncode}")
        raise ExecutionError("unsupported", f"{what}: the CPU emulator cannot compile it: {first.strip()}")
    os.replace(tmp, target)


def runtime_object() -> Path:
    """The shim's runtime (fibers, scheduler, collectives, driver), compiled once per shim and compiler."""
    shim = SHIM.read_text()
    target = emulate_cache_dir() / f"runtime-{_digest(shim, ' '.join(FLAGS + RUNTIME_FLAGS), gxx_version())[:24]}.o"
    if not target.exists():
        _compile([gxx(), *FLAGS, *RUNTIME_FLAGS, "-DSTITCH_EMU_RUNTIME", "-x", "c++", "-c", str(SHIM)], target,
                 "the emulator's runtime")
    return target


def build(ks: KernelSource) -> Path:
    """The emulation executable for `ks` (cached); ExecutionError("unsupported") when it cannot be."""
    if found := unsupported_construct(ks.source):
        what, line, text = found
        raise ExecutionError("unsupported", f"{ks.name}: the CPU emulator cannot run {what} "
                                            f"(line {line}: `{text}`)")
    if not re.fullmatch(r"[A-Za-z_]\w*", ks.name):
        raise ExecutionError("unsupported", f"kernel name {ks.name!r} is not a C identifier")
    unit = (f'#line 1 "{ks.name}.cu"\n{rewrite(ks.source)}\n#line 1 "stitch_driver.cpp"\n'
            + DRIVER.replace("KERNEL_NAME", ks.name).replace("COLLECTIVES", str(uses_collectives(ks.source)).lower()))
    runtime = runtime_object()
    key = _digest(unit, SHIM.read_text(), " ".join(FLAGS), gxx_version())
    exe = emulate_cache_dir() / f"{key}.exe"
    if exe.exists():
        return exe
    with tempfile.TemporaryDirectory(prefix="stitch-emulate-") as tmp:
        src = Path(tmp) / "unit.cpp"
        src.write_text(unit)
        _compile([gxx(), *FLAGS, "-include", str(SHIM), str(src), str(runtime)], exe, ks.name)
    return exe


# Thread runs (blocks x threads x calls) a run may take, from the measurements in the module docstring:
# about 2 us each as fibers (a softmax row's share and its collectives), about 0.1 us in the plain loop,
# so either cap keeps a run of ordinary per-thread work near 15 s on one core. Beyond, the check waits
# for a GPU instead of timing out as a "hang" that is not the proposal's fault.
MAX_FIBER_THREAD_RUNS = 1 << 23
MAX_LOOP_THREAD_RUNS = 1 << 26
EXIT_NOT_IN_FIBER, EXIT_DEADLOCK = 4, 5      # emulate_shim.h's exit codes


def check_work(ks: KernelSource, ncalls: int) -> None:
    """ExecutionError("unsupported") when emulating `ncalls` launches of `ks` would take too long."""
    blocks, threads = int(np.prod(ks.grid)), int(np.prod(ks.block))
    cap = MAX_FIBER_THREAD_RUNS if uses_collectives(ks.source) else MAX_LOOP_THREAD_RUNS
    if blocks * threads * ncalls > cap:
        raise ExecutionError("unsupported", f"{ks.name}: too much work to emulate on the CPU: {blocks} blocks x "
                                            f"{threads} threads x {ncalls} calls; it is checked on a GPU")


class CpuExecutor:
    """Runs proposals under CPU emulation (see the module docstring); `sanitize` has no CPU
    counterpart and is ignored: the canaries around every buffer are the out-of-bounds check here."""
    name = "cpu"

    def run(self, ks: KernelSource, calls: list[list[np.ndarray]], *, guard: int, timeout_s: float = 60.0,
            sanitize: bool = False) -> list[list[np.ndarray]]:
        check_launch(ks, calls, guard)
        check_work(ks, len(calls))
        exe = build(ks)
        with tempfile.TemporaryDirectory(prefix="stitch-emulate-run-") as tmp:
            work = Path(tmp)
            write_buffers(work / "in.bin", calls)
            cmd = [str(exe), str(work / "in.bin"), str(work / "out.bin"), str(guard),
                   *map(str, ks.grid), *map(str, ks.block), str(ks.shared_bytes)]
            try:
                rc, _out, err = run_child(cmd, workdir=work, timeout_s=timeout_s, what=ks.name)
            except ExecutionError as e:
                if e.check != "hang":
                    raise
                raise ExecutionError("hang", f"{ks.name} did not finish in {timeout_s:g} s under CPU emulation "
                                             f"(killed: an endless loop, a spin-wait with no __nanosleep, which "
                                             f"the emulator never interleaves, or too much work for a CPU)") from None
            if rc == EXIT_DEADLOCK:
                raise ExecutionError("hang", _fault_message(ks.name, rc, err))
            if rc == EXIT_NOT_IN_FIBER:
                raise ExecutionError("unsupported", _fault_message(ks.name, rc, err))
            if rc != 0:
                raise ExecutionError("fault", _fault_message(ks.name, rc, err))
            return read_buffers(work / "out.bin")


def _fault_message(name: str, rc: int, stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    calls = [ln for ln in lines if re.match(r"stitch-emulate: call \d+ of \d+$", ln)]
    where = f" during {calls[-1].split(': ', 1)[1]}" if calls else ""
    if rc < 0:
        # the shim's crash handler names the thread, and a stack overflow as such
        crash = next((ln.split(" crashed ", 1)[1] for ln in lines if ln.startswith("stitch-emulate: crashed in ")), "")
        place, _, why = crash.partition(": ")
        return (f"{name} crashed with {signal_name(rc)}{' ' + place if place else ''}{where} under CPU emulation "
                f"({why or 'a write far outside its buffers?'})")
    others = [ln for ln in lines if ln not in calls]
    return f"{name} failed under CPU emulation{where}: {others[-1].strip() if others else f'exit {rc}'}"
