"""What the model is told: the first messages for a region, and each round's feedback.

The first user message carries the region's ops with their reference semantics, every input and output
(shape, dtype, strides, role), the hardware, the exact signature to write, and our kernel as a starting
point with its measured time, floor and attribution when we have one. Nothing else leaves the machine:
no weights, no data, only shapes.
"""
from __future__ import annotations

import re

from ..codegen.kernel import KernelSource
from ..ir import Program, Role
from ..verify import ATOL

C_TYPES = {"float32": "float", "float64": "double", "float16": "__half", "bfloat16": "__nv_bfloat16",
           "int64": "long long", "int32": "int", "int8": "signed char", "uint8": "unsigned char", "bool": "bool"}
HARDWARE_KEYS = ("name", "compute_capability", "sm_count", "l2_bytes", "shared_bytes_per_block_optin",
                 "max_threads_per_block", "copy_bandwidth_gbs")
ERROR_LINES = 20                 # NVRTC lines fed back at most

SYSTEM = f"""You write one CUDA C++ kernel for a fused region of a dataflow program. It is compiled with
NVRTC (C++17, no include paths: use the CUDA built-ins and math functions, no #include), checked against
the program's torch reference, and timed on the GPU. It replaces our kernel only if it is correct and faster.

Answer with prose if you like, then exactly ONE fenced ```cuda block holding the whole source and ONE
fenced ```json block with the launch: {{"grid": [x, y, z], "block": [x, y, z], "shared_bytes": 0}}
(shared_bytes: dynamic shared memory; static __shared__ arrays do not count; at most 48 KiB per block).

Every proposal passes these checks; one that breaks a rule is rejected with the reason:
- it computes the outputs from the inputs on every call: no torch/ATen, cuBLAS, cuDNN, CUTLASS, CUB, Thrust;
- no launches from the kernel, no streams, events or graphs, no cudaDeviceSynchronize, memcpy, malloc,
  sleeps or clock-timed waits;
- no state kept between calls (no non-const __device__/__managed__ variables, no static locals): each
  call gets fresh inputs, one gets the previous call's inputs plus a small perturbation;
- inputs are read-only; write every output element and nothing else (canaries guard every buffer,
  outputs start as NaN); constant or all-zero outputs are caught;
- outputs must match the reference within atol = rtol = {ATOL:g} (fp32) on random draws.
Shapes are fixed: write them as compile-time constants. The buffers are contiguous (row-major) and
aligned to 256 bytes."""


def c_names(program: Program, vids) -> dict[str, str]:
    """value id -> a unique C identifier made from its name."""
    out, taken = {}, set()
    for vid in dict.fromkeys(vids):
        base = re.sub(r"\W+", "_", program.values[vid].name).strip("_") or "v"
        if base[0].isdigit():
            base = "v_" + base
        name, k = base, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        out[vid] = name
    return out


def _type(program: Program, vid: str) -> str:
    v = program.values[vid]
    return f"{v.dtype}{list(v.shape)}"


def _strides(shape) -> list[int]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return out[::-1]


def _semantics(opdef) -> str:
    if opdef.doc:
        return opdef.doc
    if opdef.cuda:    # a pointwise op's own C expression
        return "elementwise " + re.sub(r"\{(\w+)\}", r"\1", opdef.cuda) + ", with torch broadcasting"
    return f"torch.{opdef.name}"


def _attr(v) -> str:
    return repr(v) if isinstance(v, str) else str(v).replace(" ", "")


def region_text(program: Program, node_ids, names: dict[str, str]) -> str:
    """The region's ops as lines `y = op(a, b, dim=-1)   # float32[32, 200]`, then each op's semantics."""
    from ..codegen import region_io
    io = region_io(program, node_ids)
    lines, ops = [], {}
    for nid in io.nodes:
        node = program.nodes[nid]
        args = [names.get(v, "None") if v else "None" for v in node.inputs]
        args += [f"{k}={_attr(v)}" for k, v in node.attrs.items()]
        outs = ", ".join(names[v] for v in node.outputs)
        types = ", ".join(_type(program, v) for v in node.outputs)
        lines.append(f"{outs} = {node.op}({', '.join(args)})   # {types}")
        ops.setdefault(node.op, _semantics(node.opdef))
    lines.append("Semantics (torch's):")
    lines += [f"- {op}: {doc}" for op, doc in ops.items()]
    return "\n".join(lines)


def signature(program: Program, name: str, inputs, outputs, names: dict[str, str]) -> str:
    params = [f"const {C_TYPES.get(program.values[v].dtype, 'void')}* __restrict__ {names[v]}" for v in inputs]
    params += [f"{C_TYPES.get(program.values[v].dtype, 'void')}* __restrict__ {names[v]}" for v in outputs]
    return f'extern "C" __global__ void {name}({", ".join(params)})'


def _value_line(program: Program, vid: str, names, what: str) -> str:
    v = program.values[vid]
    role = "parameter (weights: the same every call)" if v.role in (Role.PARAMETER, Role.CONSTANT) \
        else "activation"
    return (f"- {names[vid]}: {what}, {v.dtype}{list(v.shape)}, contiguous strides {_strides(v.shape)} "
            f"(elements), {role}")


def _hardware(hw: dict) -> str:
    parts = [f"{k}={hw[k]:.0f}" if isinstance(hw[k], float) else f"{k}={hw[k]}"
             for k in HARDWARE_KEYS if hw.get(k) is not None]
    return ", ".join(parts) if parts else "not measured (no GPU here); assume an NVIDIA H200 (sm_90, 132 SMs)"


def _us(ms) -> str:
    return f"{ms * 1e3:.1f} us"


def _attribution(attr: dict) -> str:
    keep = {k: v for k, v in (attr or {}).items() if v is not None and not isinstance(v, (dict, list))
            and k not in ("ms", "floor_ms")}
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in keep.items())


def first_messages(program: Program, node_ids, *, name: str, ours: KernelSource | None, ours_ms, floor_ms,
                   attribution: dict, hardware: dict) -> list[dict]:
    """[system, user]: the rules and the format, then this region (module docstring)."""
    from ..codegen import region_io
    io = region_io(program, node_ids)
    names = c_names(program, [v for n in io.nodes for v in program.nodes[n].inputs if v] +
                    [v for n in io.nodes for v in program.nodes[n].outputs])
    parts = [f"Region of program '{program.name}': write the kernel `{name}`.", "",
             "Ops, in order (values named as in the signature):", region_text(program, io.nodes, names), "",
             "Inputs and outputs:"]
    parts += [_value_line(program, v, names, f"input {k + 1}") for k, v in enumerate(io.inputs)]
    parts += [_value_line(program, v, names, f"output {k + 1}") for k, v in enumerate(io.outputs)]
    parts += ["", "The kernel's signature (inputs in this order, then the outputs; nothing else):",
              signature(program, name, io.inputs, io.outputs, names) + ";", "",
              f"Hardware: {_hardware(hardware)}."]
    if floor_ms:
        parts.append(f"Memory floor of this region (bytes read once + written, at the copy bandwidth): "
                     f"{_us(floor_ms)}.")
    if ours is not None:
        timing = f"it runs in {_us(ours_ms)}" if ours_ms is not None else "it was not timed"
        attr = _attribution(attribution)
        parts += ["", f"Our kernel for it ({ours.schedule}; launch grid {list(ours.grid)}, block "
                      f"{list(ours.block)}, shared_bytes {ours.shared_bytes}): {timing}"
                      + (f"; {attr}" if attr else "") + ". Beat it:", "```cuda", ours.source.rstrip(), "```"]
    else:
        parts += ["", "We have no kernel of our own for this region: it runs as separate torch ops."]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


def _compile_lines(reason: str) -> str:
    lines = [ln for ln in re.split(r"\n|; (?=\S+\(\d+\))", reason) if ln.strip()]
    extra = len(lines) - ERROR_LINES
    return "\n".join(lines[:ERROR_LINES]) + (f"\n... and {extra} more" if extra > 0 else "")


def feedback_message(rejected_or_report, *, ms=None, ours_ms=None) -> dict:
    """The next round's user message: why the last proposal failed (a gate.Rejected, a failed
    CheckReport, an ExecutionError, a compiler.CompileError), or how fast the verified one was."""
    from ..compiler import CompileError
    r = rejected_or_report
    again = "Fix it and answer again in the same format: one ```cuda block, one ```json block."
    if isinstance(r, CompileError):
        text = f"It does not compile (NVRTC):\n{_compile_lines(r.log or str(r))}\n{again}"
    elif getattr(r, "ok", False):
        verified = f"Your kernel is correct on {r.draws} random draws (max abs error {r.max_abs_err:.3g})."
        if ms is None:
            text = f"{verified} It was checked under CPU emulation only, not timed."
        elif ours_ms is not None and ms < ours_ms:
            text = (f"{verified} It runs in {_us(ms)}, ours in {_us(ours_ms)} ({ours_ms / ms:.2f}x faster). "
                    f"If you can make it faster still, answer with the faster kernel in the same format.")
        else:
            than = f", ours in {_us(ours_ms)}" if ours_ms is not None else ""
            text = (f"{verified} But it runs in {_us(ms)}{than}: not faster. Make it faster (memory traffic, "
                    f"occupancy, vector loads) and answer in the same format.")
    else:
        check, reason = getattr(r, "check", "") or "rejected", getattr(r, "reason", "") or str(r)
        if check == "compile":
            text = f"It does not compile (NVRTC):\n{_compile_lines(reason)}\n{again}"
        else:
            text = f"Your kernel was rejected by the {check} check: {reason}\n{again}"
    return {"role": "user", "content": text}
