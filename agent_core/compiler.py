"""Compile generated CUDA with NVRTC into a cubin, cached on disk.

NVRTC comes through CuPy's binding (`cupy_backends.cuda.libs.nvrtc`), which needs no GPU: CI compiles
every generated kernel to an sm_90 cubin. On a GPU the target is the device's own architecture and the
runtime loads the cubin with cupy.RawModule. The cache key is the sha256 of the source, the options,
the architecture and the NVRTC version, so a changed kernel or compiler never reuses a stale binary.

A generated kernel (compile_kernel) is compiled in its canonical form (agent_core.canonical_source:
comments dropped, the names it declares renamed), so the regions of a model's repeated blocks, whose
kernels differ only in names, share one compile and one cache entry; CompiledKernel.entry is the
kernel's name in that cubin. `prefetch` starts the compiles of many kernels at once in a thread pool
(NVRTC releases the GIL: a compile in a thread leaves the interpreter free), and compile_kernel then
waits for the one it needs; a kernel is compiled once however many regions or threads ask for it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from .errors import StitchError

DEFAULT_ARCH = "sm_90"  # the H200 the project benchmarks on
DEFAULT_OPTIONS = ("-std=c++17", "--ptxas-options=-v")


class CompileError(StitchError):
    """NVRTC rejected a kernel. The message names the region and quotes the offending source line."""

    def __init__(self, message: str, *, region: str = "", line: int | None = None, log: str = ""):
        super().__init__(message)
        self.region = region
        self.line = line
        self.log = log


@dataclass
class CompiledKernel:
    name: str
    arch: str
    options: tuple[str, ...]
    key: str
    path: Path                     # the cubin on disk
    log: str = ""
    registers: int | None = None   # per thread, from ptxas
    spill_stores: int = 0          # bytes
    spill_loads: int = 0
    stack_bytes: int = 0
    cached: bool = False           # True when the cubin came from the cache
    seconds: float = 0.0           # compile time (0 on a cache hit)
    extra: dict = field(default_factory=dict)
    symbol: str | None = None      # the entry point's name in the cubin when it is not `name` (canonical)

    @property
    def entry(self) -> str:
        """The name to load the kernel by (cupy.RawModule.get_function)."""
        return self.symbol or self.name

    @property
    def cubin(self) -> bytes:
        return self.path.read_bytes()

    def summary(self) -> str:
        regs = "?" if self.registers is None else self.registers
        return (f"{self.name}: {self.arch}, {regs} registers, {self.spill_stores} B spill stores, "
                f"{self.spill_loads} B spill loads" + (" (cached)" if self.cached else ""))


def cache_dir() -> Path:
    root = os.environ.get("STITCHCUDA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "stitchcuda")
    path = Path(root) / "kernels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _nvrtc():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as exc:  # cupy missing or its CUDA libraries absent
        raise CompileError(f"NVRTC is not available ({exc}); install cupy-cuda13x and nvidia-cuda-nvrtc") from None
    return nvrtc


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    major, minor = _nvrtc().getVersion()
    return f"{major}.{minor}"


@lru_cache(maxsize=1)
def device_arch() -> str | None:
    """sm_XY of GPU 0, or None when there is no usable GPU."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        major, minor = divmod(int(cupy.cuda.Device(0).compute_capability), 10)
        return f"sm_{major}{minor}"
    except Exception:  # no driver, no device: compile for the default target instead
        return None


def default_arch() -> str:
    return device_arch() or DEFAULT_ARCH


def feature_arch(source: str, arch: str) -> str:
    """sm_90a for a kernel with Hopper's warpgroup MMA (wgmma exists only in the arch-specific target,
    whose cubin runs on sm_90 devices alone), else arch."""
    return arch + "a" if arch == "sm_90" and "wgmma." in source else arch


def cache_key(source: str, options, arch: str) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch, nvrtc_version()):
        h.update(part.encode())
        h.update(b"\x00\x01")
    return h.hexdigest()


def _parse_ptxas(log: str) -> dict:
    out = {}
    if m := re.search(r"Used (\d+) registers", log):
        out["registers"] = int(m.group(1))
    if m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["stack_bytes"], out["spill_stores"], out["spill_loads"] = map(int, m.groups())
    return out


def _error_message(name: str, source: str, log: str, filename: str) -> tuple[str, int | None]:
    m = re.search(rf"{re.escape(filename)}\((\d+)\): (?:catastrophic )?error: (.*)", log)
    if not m:
        first = next((ln.strip() for ln in log.splitlines() if "error" in ln), log.strip()[:200])
        return f"region {name}: CUDA compile failed: {first}", None
    line = int(m.group(1))
    lines = source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"region {name}: CUDA compile error at line {line}: {m.group(2).strip()}: `{text}`", line


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def compile_source(source: str, name: str, *, arch: str | None = None, options=DEFAULT_OPTIONS,
                   use_cache: bool = True, canonical: bool = False) -> CompiledKernel:
    """Compile CUDA C++ source to a cubin for `arch` (the GPU's, else sm_90); CompileError on failure.

    canonical: compile the source up to its names (load the result by CompiledKernel.entry); a
    source the canonical form does not compile for is compiled as written, so errors read the same."""
    arch = arch or default_arch()
    options = tuple(options)
    if canonical:
        from .canonical_source import canonical_form
        form = canonical_form(source, name)
        if form is not None:
            key = cache_key(CANONICAL_TAG + form.text, options, arch)
            if key not in _NOT_CANONICAL:
                try:
                    built = _compile_shared(form.text, key, arch, options, use_cache)
                    return replace(built, name=name, symbol=form.symbol, extra=dict(built.extra))
                except CompileError:
                    _NOT_CANONICAL.add(key)   # a name it renamed was not its own: compile it as written
    return _compile_shared(source, cache_key(source, options, arch), arch, options, use_cache, name=name)


def prefetch(kernels, *, arch: str | None = None, options=DEFAULT_OPTIONS) -> int:
    """Start compiling each codegen.KernelSource not yet cached, in the background; returns how many
    compiles were started. compile_kernel of one of them waits for its compile (or its error)."""
    from .canonical_source import canonical_form
    arch = arch or default_arch()
    options = tuple(options)
    started = 0
    for ks in kernels:
        form = canonical_form(ks.source, ks.name)
        text = form.text if form is not None else ks.source
        key = cache_key(CANONICAL_TAG + text if form is not None else text, options, arch)
        if key in _NOT_CANONICAL or _cached(key):
            continue
        with _LOCK:
            if (str(cache_dir()), key) in _INFLIGHT:
                continue
            _INFLIGHT[(str(cache_dir()), key)] = _pool().submit(_compile_text, text, key, arch, options, True,
                                                  name=ks.name if form is None else "kernel")
        started += 1
    return started


# the canonical text's cache entries are told apart from those of a source compiled as written
CANONICAL_TAG = "// stitchcuda canonical form v1\n"
_NOT_CANONICAL: set[str] = set()          # keys whose canonical text did not compile
_INFLIGHT: dict[tuple[str, str], Future] = {}   # (cache folder, key) -> a prefetch's compile, until collected
_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        workers = int(os.environ.get("STITCHCUDA_COMPILE_WORKERS") or 0) or min(32, os.cpu_count() or 1)
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nvrtc")
    return _POOL


def _cached(key: str) -> bool:
    cdir = cache_dir()
    return (cdir / f"{key}.cubin").exists() and (cdir / f"{key}.json").exists()


def _compile_shared(source: str, key: str, arch: str, options, use_cache: bool, *, name: str = "kernel"):
    """The compile of `key`: the one a prefetch started (waited for, once), else done here."""
    with _LOCK:
        fut = _INFLIGHT.pop((str(cache_dir()), key), None) if use_cache else None
    if fut is not None:
        built = fut.result()         # its CompileError is raised here, in the caller's thread
        return replace(built, name=name, extra=dict(built.extra))
    return _compile_text(source, key, arch, options, use_cache, name=name)


def _compile_text(source: str, key: str, arch: str, options, use_cache: bool, *, name: str) -> CompiledKernel:
    cdir = cache_dir()
    cubin_path, meta_path = cdir / f"{key}.cubin", cdir / f"{key}.json"
    if use_cache and cubin_path.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            return CompiledKernel(name, arch, options, key, cubin_path, meta.get("log", ""),
                                  cached=True, **_parse_ptxas(meta.get("log", "")))
        except (OSError, ValueError):
            pass  # a damaged entry is rebuilt below
    nvrtc = _nvrtc()
    filename = f"{name}.cu"
    t0 = time.perf_counter()
    prog = nvrtc.createProgram(source, filename, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"-arch={feature_arch(source, arch)}", *options])
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            msg, line = _error_message(name, source, log, filename)
            raise CompileError(msg, region=name, line=line, log=log) from None
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    seconds = time.perf_counter() - t0
    _write_atomic(cubin_path, cubin)
    _write_atomic(meta_path, json.dumps({"name": name, "arch": arch, "options": list(options),
                                          "nvrtc": nvrtc_version(), "log": log}).encode())
    return CompiledKernel(name, arch, options, key, cubin_path, log, seconds=seconds, **_parse_ptxas(log))


def compile_kernel(kernel, *, arch: str | None = None, options=DEFAULT_OPTIONS,
                   use_cache: bool = True) -> CompiledKernel:
    """Compile a codegen.KernelSource (in its canonical form: load it by CompiledKernel.entry)."""
    return compile_source(kernel.source, kernel.name, arch=arch, options=options, use_cache=use_cache,
                          canonical=True)
