"""The anti-hack gate a model's proposal passes before it may be timed (the known KernelBench loopholes).

static_check reads the source (comments and string literals blanked first, so "torch" in a comment is
fine): no torch/ATen, no vendor libraries outside a library region, no launches or streams of its own,
no host synchronisation or timed waits, no state kept in device globals between calls, no headers
beyond CUDA's own.

check_proposal runs the kernel through an executor (executors.py: a child process, CPU emulation or
the GPU) on guarded buffers: canary bytes around every argument, outputs pre-filled with a NaN poison.
Fresh draws of the program's reference, then one call whose inputs are the previous call's plus a small
perturbation, all in ONE run so that state a kernel keeps between launches shows. After each call, in
this order: guards intact, inputs unchanged, outputs finite where the reference is, not constant, not
a replay of the previous call, equal to the reference at verify's tolerance.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..codegen.kernel import KernelSource
from ..ir import Program
from ..ops import DTYPE_BYTES
from .endpoint import WriterError

GUARD = 4096      # canary bytes before and after every argument: a row or more of most regions, and a
                  # multiple of 256 so the kernel's pointers are aligned as fresh allocations are
PERTURB = 1e-2               # the perturbed call adds PERTURB * mean|t| * N(0, 1) to every float input
# headers CUDA itself provides (NVRTC's built-ins where it has them); anything else is not ours to compile
CUDA_HEADERS = re.compile(r"(cuda_(fp16|bf16|fp8|fp6|fp4)\.h(pp)?|cuda/std/\w+|cuda/(barrier|pipeline|atomic"
                          r"|annotated_ptr|ptx)|cooperative_groups(\.h|/\w+\.h)|cuda_pipeline(_primitives)?\.h"
                          r"|cuda_awbarrier(_primitives)?\.h|mma\.h|sm_\d+_intrinsics\.h)\Z")


class Rejected(WriterError):
    """A proposal that failed a check: `check` is the check's short name, `reason` one line a user
    (and the model, as feedback) reads."""

    def __init__(self, check: str, reason: str):
        super().__init__(f"rejected ({check}): {reason}")
        self.check, self.reason = check, reason


@dataclass
class CheckReport:
    ok: bool
    check: str           # "" when ok, else the failed check's name
    reason: str
    max_abs_err: float   # the largest error against the reference over the calls compared
    draws: int           # fresh draws verified (all of them when ok)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "check": self.check, "reason": self.reason, "max_abs_err": self.max_abs_err,
                "draws": self.draws}


# --- the source text ------------------------------------------------------------------------------------

def blank(source: str, *, strings: bool = True) -> str:
    """source with comments (and, when `strings`, the contents of string and character literals)
    replaced by spaces: the same length and lines, so positions still name the original line."""
    out, i, n = list(source), 0, len(source)
    while i < n:
        if source.startswith("//", i):
            j = source.find("\n", i)
            lo, hi = i, (n if j < 0 else j)
            nxt = hi
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            lo, hi = i, (n if j < 0 else j + 2)
            nxt = hi
        elif source[i] in "\"'":
            j = i + 1
            while j < n and source[j] not in (source[i], "\n"):
                j += 2 if source[j] == "\\" else 1
            if not strings:
                i = j + 1
                continue
            lo, hi, nxt = i + 1, min(j, n), j + 1     # the quotes stay: `extern "C"` reads `extern " "`
        else:
            i += 1
            continue
        for k in range(lo, hi):
            if out[k] != "\n":
                out[k] = " "
        i = nxt
    return "".join(out)


def _no_preprocessor(code: str) -> str:
    """code with its preprocessor lines blanked (a macro's parentheses are no declaration's)."""
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group()), code, flags=re.M)


def _where(source: str, pos: int) -> str:
    line = source.count("\n", 0, pos) + 1
    text = source.splitlines()[line - 1].strip() if source else ""
    return f"line {line}: `{text[:120]}`"


def includes(source: str) -> list[tuple[int, str]]:
    """(position, header) of every #include outside comments."""
    code = blank(source, strings=False)
    return [(m.start(), m.group(1).strip()) for m in
            re.finditer(r"^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"\n]+)[>\"]", code, re.M)]


_TORCH_HEADER = re.compile(r"(torch|ATen|c10|caffe2|pybind11)/|(Python|torch/extension)\.h\Z")
_TORCH_CODE = re.compile(r"\b(torch|at|c10|pybind11|py)::|\b(PYBIND11_\w+|TORCH_\w+|AT_DISPATCH\w*)\b")
_LIBRARY_HEADER = re.compile(r"(cublas|cudnn|cufft|cusparse|cusolver)\w*\.h\Z|(cutlass|cute|thrust|cub)/")
_LIBRARY_CODE = re.compile(r"\b(cublas|cudnn|cufft|cusparse|cusolver)\w*|\b(cutlass|cute|thrust|cub)::")
_STREAM_CODE = re.compile(r"<<<|\b(cudaStream|cudaLaunch|cudaGraph|cudaEvent|cuLaunch|cuStream|cuGraph)\w*")
_SYNC_CODE = re.compile(r"\b(cudaDeviceSynchronize|cudaMemcpy\w*|cudaMemset\w*|cudaMalloc\w*|cudaFree\w*)\b"
                        r"|\b(__nanosleep|clock64|clock|__globaltimer)\s*\(")
_SYNC_ASM = re.compile(r"%%?(globaltimer\w*|clock\w*)|\bnanosleep\b")


def _first(pattern: re.Pattern, text: str):
    return next(pattern.finditer(text), None)


def _scopes(code: str):
    """(position, depth, head, end) for every declaration head of `code` (comments and strings blanked):
    the text since the previous `;`, `{` or `}` up to the next one. depth counts braces, except those of
    a namespace or an extern "C" block (their contents are still file scope)."""
    stack: list[bool] = []     # True for a brace that opens a real scope
    start = 0
    for m in re.finditer(r"[;{}]", code):
        head = code[start:m.start()]
        depth = sum(stack)
        yield start, depth, head, m.group()
        if m.group() == "{":
            stack.append(not re.search(r"\bnamespace\b[\w\s:]*\Z|\bextern\s+\"\s*\"\s*\Z", head))
        elif m.group() == "}" and stack:
            stack.pop()
        start = m.end()


def _state(code: str):
    """The first declaration that keeps state between launches: a non-const __device__ / __managed__
    variable, or a static variable inside a function that is not __shared__ (both live in global memory
    for the module's lifetime)."""
    for pos, depth, head, end in _scopes(_no_preprocessor(code)):
        words = set(re.findall(r"\w+", head))
        if words & {"const", "constexpr", "__constant__", "typedef", "using"}:
            continue
        decl = head.split("=")[0]
        is_function = "(" in decl and not re.search(r"\[\s*[^\]]*\(", decl)
        if end == "{" and is_function:
            continue
        if words & {"__device__", "__managed__"} and not is_function:
            return pos + len(head) - len(head.lstrip())
        if depth > 0 and "static" in words and "__shared__" not in words and not is_function:
            return pos + len(head) - len(head.lstrip())
    return None


def static_check(ks: KernelSource, *, library_region: bool = False) -> None:
    """Raise Rejected naming the first forbidden construct of ks.source, with its line."""
    src = ks.source
    code = blank(src)
    heads = includes(src)
    for pos, h in heads:
        if _TORCH_HEADER.search(h):
            raise Rejected("torch", f"{_where(src, pos)} includes a torch/ATen/pybind header; a proposal is "
                                    f"plain CUDA C++: compute the ops yourself, without torch")
    if m := _first(_TORCH_CODE, code):
        raise Rejected("torch", f"{_where(src, m.start())} calls into torch/ATen ({m.group().rstrip(':')}); "
                                f"a proposal may not call torch: compute the ops yourself")
    if not library_region:
        for pos, h in heads:
            if _LIBRARY_HEADER.search(h):
                raise Rejected("library", f"{_where(src, pos)} includes a vendor library header; this region "
                                          f"is not a library region: no cuBLAS/cuDNN/CUTLASS/CUB/Thrust")
        if m := _first(_LIBRARY_CODE, code):
            raise Rejected("library", f"{_where(src, m.start())} calls a vendor library ({m.group()}); this "
                                      f"region is not a library region: write the kernel's math yourself")
    if m := _first(_STREAM_CODE, code):
        raise Rejected("stream", f"{_where(src, m.start())}: launches, streams, graphs and events are not "
                                 f"allowed; the kernel runs once, as launched by us on our stream")
    asm = "".join(m.group() for m in re.finditer(r"\"[^\"\n]*\"", blank(src, strings=False)))
    if (m := _first(_SYNC_CODE, code)) or _first(_SYNC_ASM, asm):
        what = f"{_where(src, m.start())}: " if m else "inline PTX reads a clock or sleeps: "
        raise Rejected("host-sync", what + "no device synchronisation, memory copies or allocations, sleeps "
                                           "or clock-timed waits in a kernel")
    if (pos := _state(code)) is not None:
        raise Rejected("global-state", f"{_where(src, pos)} declares device memory that outlives a launch; "
                                       f"no state may be kept between calls (use registers or __shared__)")
    for pos, h in heads:
        if not CUDA_HEADERS.match(h):
            raise Rejected("format", f"{_where(src, pos)}: only CUDA's own headers may be included (none is "
                                     f"needed: the built-ins, math functions and intrinsics are there)")


# --- running on guarded buffers ---------------------------------------------------------------------

def _canary() -> np.ndarray:
    return np.random.default_rng(0x5717C4).integers(0, 256, GUARD, dtype=np.uint8)


# a quiet NaN with a recognisable payload per float dtype; other dtypes get the byte 0xA5
_POISON = {"float32": 0x7FC0DEAD, "float64": 0x7FF8DEADDEADDEAD, "float16": 0x7E5A, "bfloat16": 0x7FDA}


def _poison(dtype: str, nbytes: int) -> np.ndarray:
    if dtype not in _POISON:
        return np.full(nbytes, 0xA5, np.uint8)
    size = nbytes // max(1, {"float64": 8, "float32": 4}.get(dtype, 2))
    word = {"float64": np.uint64, "float32": np.uint32}.get(dtype, np.uint16)
    return np.full(size, _POISON[dtype], word).view(np.uint8)


def _as_bytes(t) -> np.ndarray:
    import torch
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def _from_bytes(payload: np.ndarray, dtype: str, shape):
    import torch
    from ..ops.common import torch_dtype
    return torch.from_numpy(np.ascontiguousarray(payload).copy()).view(torch_dtype(dtype)).reshape(tuple(shape))


def _guarded(payload: np.ndarray, canary: np.ndarray) -> np.ndarray:
    return np.concatenate([canary, payload, canary])


def _perturbed(ins: list, seed: int) -> list:
    import torch
    gen = torch.Generator().manual_seed(seed + 0x9E37)
    out = []
    for t in ins:
        if t.dtype.is_floating_point:
            f = t.double()
            scale = float(f.abs().mean()) or 1.0
            f = f + PERTURB * scale * torch.randn(f.shape, generator=gen, dtype=torch.float64)
            t = f.to(t.dtype)
        out.append(t)
    return out


def _guard_damage(buf: np.ndarray, canary: np.ndarray) -> str | None:
    """Where the canaries around a buffer were overwritten, or None."""
    before, after = buf[:GUARD] != canary, buf[len(buf) - GUARD:] != canary
    parts = []
    if before.any():
        parts.append(f"up to {GUARD - int(np.nonzero(before)[0][0])} bytes before its start "
                     f"({int(before.sum())} guard bytes changed)")
    if after.any():
        parts.append(f"up to {int(np.nonzero(after)[0][-1]) + 1} bytes past its end "
                     f"({int(after.sum())} guard bytes changed)")
    return " and ".join(parts) or None


def _flat_where(why: str, shape) -> str:
    """compare()'s reason with its flat element index also given as a row-major index into `shape`."""
    m = re.search(r"element (\d+)", why)
    if not m or len(shape) < 2:
        return why
    idx = [int(i) for i in np.unravel_index(int(m.group(1)), tuple(shape))]
    return why.replace(m.group(0), f"{m.group(0)} = index {idx} of {list(shape)}", 1)


def check_proposal(program: Program, node_ids, ks: KernelSource, executor, *, draws: int = 3, seed: int = 0,
                   timeout_s: float = 60.0, sanitize: bool = False) -> CheckReport:
    """The dynamic checks (module docstring): draws fresh draws (seeds seed..) and one perturbed call,
    all in one executor run. sanitize: ask the executor to run under compute-sanitizer memcheck."""
    import torch
    from ..agent.refcache import ReferenceCache
    from ..codegen import region_io
    from ..reference import run_node
    from ..verify import compare
    io = region_io(program, node_ids)
    if list(ks.inputs) != io.inputs or list(ks.outputs) != io.outputs:
        raise WriterError(f"{ks.name}: its arguments ({ks.inputs} -> {ks.outputs}) are not the region's "
                          f"({io.inputs} -> {io.outputs})")
    vals = program.values
    cache = ReferenceCache(program, set(io.inputs) | set(io.outputs), device="cpu")
    cases = []       # (label, input tensors, expected output tensors)
    for d in range(seed, seed + draws):
        env = cache.draw(d)
        cases.append((f"draw {d}", [env[v] for v in io.inputs], [env[v] for v in io.outputs]))
    ins = _perturbed(cases[-1][1], seed)
    env = dict(zip(io.inputs, ins))
    with torch.no_grad():
        for nid in io.nodes:
            run_node(program, nid, env)
    cases.append((f"the call after {cases[-1][0]} (its inputs plus a small perturbation)", ins,
                  [env[v] for v in io.outputs]))

    canary = _canary()
    sent = [[_as_bytes(t) for t in case_ins] for _, case_ins, _ in cases]
    calls = [[_guarded(b, canary) for b in payloads] +
             [_guarded(_poison(vals[v].dtype, vals[v].nbytes), canary) for v in io.outputs] for payloads in sent]
    names = [vals[v].name for v in io.inputs + io.outputs]
    try:
        results = executor.run(ks, calls, guard=GUARD, timeout_s=timeout_s, sanitize=sanitize)
    except WriterError as exc:
        check = getattr(exc, "check", "fault")
        return CheckReport(False, check, getattr(exc, "reason", None) or str(exc), 0.0, 0)
    if len(results) != len(calls):
        raise WriterError(f"executor {executor.name} returned {len(results)} calls' buffers, want {len(calls)}")

    def fail(check, k, why, err=0.0):
        return CheckReport(False, check, f"{cases[k][0]}: {why}", err, min(k, draws))

    worst, prev_got = 0.0, None
    for k, ((label, _, want), bufs) in enumerate(zip(cases, results)):
        for j, buf in enumerate(bufs):
            if (damage := _guard_damage(buf, canary)) is not None:
                size = len(buf) - 2 * GUARD
                return fail("out-of-bounds", k, f"wrote outside '{names[j]}' ({size} bytes): {damage}; write "
                                                f"only the outputs' own elements")
        for j, (before, buf) in enumerate(zip(sent[k], bufs)):
            after = buf[GUARD:len(buf) - GUARD]
            if not np.array_equal(before, after):
                v = vals[io.inputs[j]]
                item = DTYPE_BYTES[v.dtype]
                first = int(np.nonzero(before != after)[0][0]) // item
                was = _from_bytes(before, v.dtype, v.shape).reshape(-1)[first].item()
                now = _from_bytes(after, v.dtype, v.shape).reshape(-1)[first].item()
                return fail("mutates-input", k, f"changed input '{v.name}' (element {first}: was {was:.6g}, "
                                                f"now {now:.6g}); inputs are read-only")
        got = [_from_bytes(buf[GUARD:len(buf) - GUARD], vals[v].dtype, vals[v].shape)
               for v, buf in zip(io.outputs, bufs[len(io.inputs):])]
        for v, g, w in zip(io.outputs, got, want):
            if not g.dtype.is_floating_point:
                continue
            bad = torch.isfinite(w) & ~torch.isfinite(g)
            if bad.any():
                first = int(bad.reshape(-1).nonzero()[0])
                poison = _poison(vals[v].dtype, 8)[:g.element_size()]
                raw = _as_bytes(g.reshape(-1)[first:first + 1])
                what = ("was never written (it still holds the NaN we fill outputs with)"
                        if np.array_equal(raw, poison) else f"is {g.reshape(-1)[first].item()}")
                return fail("non-finite", k, f"element {first} of '{vals[v].name}' {what}, the reference has "
                                             f"{w.reshape(-1)[first].item():.6g}; write every output element")
        for v, g, w in zip(io.outputs, got, want):
            flat, wflat = g.reshape(-1), w.reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()) and not bool((wflat == wflat[0]).all()):
                value = flat[0].item()
                what = "0 everywhere (all zero)" if value == 0 else f"{value:.6g} everywhere (constant)"
                return fail("constant", k, f"'{vals[v].name}' is {what} while the reference varies (from "
                                           f"{wflat.min().item():.4g} to {wflat.max().item():.4g}): compute "
                                           f"it from the inputs")
        if prev_got is not None and all(torch.equal(a, b) for a, b in zip(got, prev_got)) \
                and not all(torch.equal(a, b) for a, b in zip(want, cases[k - 1][2])):
            return fail("state", k, "returned bit for bit what the call before it returned, although its "
                                    "inputs and the reference changed: the kernel keeps state between calls "
                                    "(a cache or a flag in device memory)")
        for v, g, w in zip(io.outputs, got, want):
            ok, err, _, why = compare(program, v, g, w)
            worst = max(worst, err)
            if not ok:
                return fail("mismatch", k, _flat_where(why, vals[v].shape), worst)
        prev_got = got
    return CheckReport(True, "", "", worst, draws)
