"""CUDA's float math functions, bit for bit on the CPU: NVRTC's own PTX of `y = f(x)` translated to C.

codegen/monotone.py lets a max or min fold the input of log / log2 and apply them once per row, which
is exact only if CUDA's logf and log2f are non-decreasing as *implemented* (they are not correctly
rounded, so that does not follow from their error bound). Without fast math both are a short run of
correctly rounded PTX operations (fma.rn, mul, add, integer bit operations, selects and one branch),
so their PTX, translated instruction by instruction into C (fmaf, IEEE float with denormals, as sm_90
computes without .ftz), computes the same bits on the CPU, and every float32 can be checked.

The translation refuses what it cannot reproduce exactly: an instruction it does not know (the SFU's
ex2.approx / lg2.approx in expf or under fast math), a rounding mode other than round-to-nearest,
an .ftz form, and a plain mul.f32 whose result feeds a plain add.f32 / sub.f32 (ptxas may contract
that pair into one fma, which rounds once instead of twice).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

KERNEL = '{prelude}extern "C" __global__ void f(const float* x, float* y) {{ y[threadIdx.x] = {fn}(x[threadIdx.x]); }}\n'


class Untranslatable(Exception):
    pass


def nvrtc_ptx(fn: str, prelude: str = "") -> str:
    """The PTX NVRTC makes for sm_90 of a kernel storing fn(x) (a device function `prelude` may
    define), compiled as the project compiles."""
    from cupy_backends.cuda.libs import nvrtc
    prog = nvrtc.createProgram(KERNEL.format(fn=fn, prelude=prelude), "f.cu", [], [])
    try:
        nvrtc.compileProgram(prog, ["-arch=compute_90", "-std=c++17"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def _imm(tok: str, kind: str) -> str:
    if tok.startswith("0f"):
        return f"bits_f(0x{tok[2:]}u)"
    if re.fullmatch(r"-?\d+", tok):
        return f"(int32_t){tok}" if kind == "s" else f"(uint32_t){tok}u" if not tok.startswith("-") \
            else f"(uint32_t)(int32_t){tok}"
    raise Untranslatable(f"immediate {tok}")


def _reg(tok: str) -> str:
    m = re.fullmatch(r"%([fpr])(\d+)", tok)
    if not m:
        raise Untranslatable(f"operand {tok}")
    return f"{m.group(1)}{m.group(2)}"


def _op(tok: str, kind: str = "f") -> str:
    """A source operand: a register as its C variable (an s32 read of a b32 register as int32_t), or
    an immediate."""
    if tok.startswith("%"):
        r = _reg(tok)
        return f"(int32_t){r}" if kind == "s" and r[0] == "r" else r
    return _imm(tok, kind)


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def translate(ptx: str) -> str:
    """The C function `float f(float x)` computing what the PTX kernel stores."""
    body = ptx[ptx.index("{", ptx.index(".entry")) + 1: ptx.rindex("}")]
    lines, muls, plain_adds = [], set(), []
    started = False
    for raw in body.splitlines():
        ln = raw.split("//")[0].strip()
        if not ln or ln.startswith(".reg"):
            continue
        if ln.endswith(":"):
            lines.append(f"{ln[:-1].lstrip('$')}:;")
            continue
        ln = ln.rstrip(";")
        guard = ""
        m = re.match(r"@(!?)%p(\d+)\s+(.*)", ln)
        if m:
            guard, ln = f"if ({'!' if m.group(1) else ''}p{m.group(2)}) ", m.group(3)
        parts = ln.split(None, 1)
        instr, args = parts[0], [a.strip() for a in parts[1].split(",")] if len(parts) > 1 else []
        if instr.startswith("ld.global.f32"):
            lines.append(f"{_reg(args[0])} = x;")
            started = True
            continue
        if not started:
            continue           # the parameter and index arithmetic before the load
        if instr.startswith("st.global.f32"):
            lines.append(f"return {_op(args[1])};")
            break
        if any(re.match(r"%(rd|tid|ntid|ctaid)", a) for a in args):
            continue           # the store's address arithmetic
        if ".ftz" in instr or re.search(r"\.(rz|rm|rp)\b", instr):
            raise Untranslatable(f"{instr}: not round-to-nearest with denormals")
        if instr == "bra" or instr == "bra.uni":
            lines.append(f"{guard}goto {args[0].lstrip('$')};")
            continue
        d = _reg(args[0]) if args else ""
        if instr in ("mul.f32", "mul.rn.f32", "add.f32", "add.rn.f32", "sub.f32", "sub.rn.f32"):
            sym = {"mul": "*", "add": "+", "sub": "-"}[instr.split(".")[0]]
            if instr == "mul.f32":
                muls.add(d)
            if instr in ("add.f32", "sub.f32"):
                plain_adds.append(args[1:])
            expr = f"{_op(args[1])} {sym} {_op(args[2])}"
        elif instr == "fma.rn.f32":
            expr = f"fmaf({_op(args[1])}, {_op(args[2])}, {_op(args[3])})"
        elif instr == "sqrt.rn.f32":           # IEEE square root, correctly rounded on both sides
            expr = f"sqrtf({_op(args[1])})"
        elif instr in ("neg.f32", "abs.f32"):
            expr = f"-{_op(args[1])}" if instr == "neg.f32" else f"fabsf({_op(args[1])})"
        elif instr in ("mov.f32", "mov.b32", "mov.u32"):
            src, dst = args[1], d
            if src.startswith("%") and _reg(src)[0] != dst[0]:
                expr = f"bits_f({_reg(src)})" if dst[0] == "f" else f"f_bits({_reg(src)})"
            else:
                expr = _op(src)
        elif instr in ("selp.f32", "selp.b32"):
            expr = f"{_op(args[3])} ? {_op(args[1])} : {_op(args[2])}"
        elif (m := re.fullmatch(r"setp\.(\w+)\.(f32|u32|s32|b32)", instr)):
            if m.group(1) not in _CMP:
                raise Untranslatable(instr)
            kind = "s" if m.group(2) == "s32" else "f" if m.group(2) == "f32" else "u"
            expr = f"{_op(args[1], kind)} {_CMP[m.group(1)]} {_op(args[2], kind)}"
        elif (m := re.fullmatch(r"(add|sub)\.(s32|u32)", instr)):
            expr = f"(uint32_t)({_op(args[1])} {'+' if m.group(1) == 'add' else '-'} {_op(args[2])})"
        elif (m := re.fullmatch(r"(and|or|xor)\.b32", instr)):
            expr = f"{_op(args[1])} {dict(zip(('and', 'or', 'xor'), '&|^'))[m.group(1)]} {_op(args[2])}"
        elif instr == "shl.b32":
            expr = f"{_op(args[1])} << {_op(args[2])}"
        elif instr == "shr.u32":
            expr = f"{_op(args[1])} >> {_op(args[2])}"
        elif instr == "shr.s32":
            expr = f"(uint32_t)({_op(args[1], 's')} >> {_op(args[2])})"
        elif instr == "cvt.rn.f32.s32":
            expr = f"(float){_op(args[1], 's')}"
        elif instr == "cvt.rn.f32.u32":
            expr = f"(float){_op(args[1])}"
        else:
            raise Untranslatable(instr)
        lines.append(f"{guard}{d} = {expr};")
    else:
        raise Untranslatable("no store of the result")
    for a in plain_adds:
        if any(t.startswith("%") and _reg(t) in muls for t in a):
            raise Untranslatable("a plain mul.f32 feeds a plain add: ptxas may contract them into an fma")
    regs = sorted({r for ln in lines for r in re.findall(r"\b([fpr]\d+)\b", ln)})
    decl = [f"  {'float' if r[0] == 'f' else 'bool' if r[0] == 'p' else 'uint32_t'} {r} = 0;" for r in regs]
    return "\n".join(["static float f(float x) {", *decl, *["  " + ln for ln in lines], "}"])


CHECK = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
static inline float bits_f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t f_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
__FUNCTION__
// every float from +0 to +inf in order: f must never decrease (the scan stops at the first decrease)
// and never give NaN; NaN payloads and
// -0 at the ends; the largest distance from the double-precision reference, in float32 ulps
int main() {
  float prev = f(0.0f);
  long long drops = 0, nans = 0;
  double worst = 0;
  uint32_t first_drop = 0;
  for (uint32_t u = 1; u <= 0x7f800000u; ++u) {
    const float x = bits_f(u), y = f(x);
    if (y != y) { ++nans; continue; }
    if (y < prev) { first_drop = u; ++drops; break; }   // one is enough to refuse
    prev = y;
    if ((u & 0xfffu) == 7u && u < 0x7f800000u) {
      const double want = REF((double)x);
      const float w = (float)want;
      const double ulp = std::fabs((double)std::nextafter(w, INFINITY) - (double)w);
      if (std::isfinite(want) && std::fabs((double)y - want) / ulp > worst) worst = std::fabs((double)y - want) / ulp;
    }
  }
  const uint32_t nan_in[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0xffc00000u};
  int nan_ok = 1;
  for (uint32_t u : nan_in) { const float y = f(bits_f(u)); nan_ok &= (y != y); }
  std::printf("drops %lld first %08x nans %lld worst_ulp %.3f nan_to_nan %d zero %a negzero %a inf %a\n",
              drops, first_drop, nans, worst, nan_ok, (double)f(0.0f), (double)f(-0.0f), (double)f(INFINITY));
  return 0;
}
"""

_REF = {"logf": "std::log", "log2f": "std::log2", "sqrtf": "std::sqrt", "log10f": "std::log10",
        "expf": "std::exp"}


def check_monotone(fns, workdir: Path, prelude: str = "") -> dict:
    """For each of fns: translate NVRTC's PTX, run it over every float in [+0, +inf] on the CPU (the
    functions at once, one process each): the counts of decreases and NaN outputs, the worst ulp
    distance from the double reference on a sample (a wrong translation is far off), whether NaN
    inputs give NaN, and f(+0), f(-0), f(inf). Untranslatable when a PTX is not exactly reproducible
    in C."""
    cxx = shutil.which("g++")
    if cxx is None:
        raise Untranslatable("no g++")
    # strict IEEE float: no contraction, no fast math; -mfma only makes fmaf one instruction
    flags = ["-O2", "-std=c++17", "-ffp-contract=off", "-fno-fast-math"]
    if "fma" in Path("/proc/cpuinfo").read_text().split():
        flags.append("-mfma")
    runs = {}
    for fn in fns:
        src = CHECK.replace("__FUNCTION__", translate(nvrtc_ptx(fn, prelude))).replace("REF", _REF.get(fn, ""))
        c, exe = workdir / f"{fn}.cpp", workdir / fn
        c.write_text(src)
        subprocess.run([cxx, *flags, "-o", str(exe), str(c)], check=True, capture_output=True)
        runs[fn] = (src, subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True))
    out = {}
    for fn, (src, proc) in runs.items():
        text, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, (fn, proc.returncode)
        words = text.split()
        vals = dict(zip(words[0::2], words[1::2]))
        out[fn] = {"drops": int(vals["drops"]), "nans": int(vals["nans"]), "worst_ulp": float(vals["worst_ulp"]),
                   "nan_to_nan": vals["nan_to_nan"] == "1", "zero": float.fromhex(vals["zero"]),
                   "negzero": float.fromhex(vals["negzero"]), "inf": float.fromhex(vals["inf"]), "source": src}
    return out
