"""Library calls in a lower precision than fp32, only where the user allows it: TF32 (inputs rounded to
10 mantissa bits on the tensor cores, fp32 accumulation and output), fp16 (10 bits, a 5-bit exponent)
and bf16 (7 bits, fp32's range), the last two with the operands cast per call, fp32 accumulation
(torch's reduced-precision reductions off for the call) and the result cast back to fp32.

None of them is inside KernelBench's 1e-4 against fp32: a program opts in with
program.metadata["allow_precision"] (a list of "tf32", "fp16", "bf16"; `optimize --allow-precision`)
and a tolerance of its own (verify.tolerance). The agent then times these forms with the others
(agent/precision.py) and keeps one only where it agrees with fp32 within that tolerance on the timing
draw and the whole program verifies within it on every draw, like any form.
"""
from __future__ import annotations

from ..errors import ProgramError
from ..ir import Program

TF32, FP16, BF16 = "tf32", "fp16", "bf16"
FORMS = (TF32, FP16, BF16)      # most accurate first
DESCRIPTIONS = {TF32: "TF32: inputs rounded to 10 mantissa bits on the tensor cores, fp32 accumulation and result",
                FP16: "fp16: operands and result in fp16 (10 mantissa bits, values up to 65504), fp32 accumulation",
                BF16: "bf16: operands and result in bf16 (7 mantissa bits, fp32's range), fp32 accumulation"}


def allowed(program: Program) -> list[str]:
    """The lower-precision forms the program allows, most accurate first. A malformed entry (a project
    file is user input) raises ProgramError naming it."""
    entry = program.metadata.get("allow_precision") or []
    if not isinstance(entry, list) or any(f not in FORMS for f in entry):
        raise ProgramError(f"the program's allow_precision must be a list of {', '.join(FORMS)}, not {entry!r:.80}")
    return [f for f in FORMS if f in entry]


def _dtype(form: str):
    import torch
    return torch.float16 if form == FP16 else torch.bfloat16


def _fp32_accumulation():
    """cuBLAS accumulates half-precision products in fp32 inside the calls (torch lets it reduce in
    half precision by default)."""
    import torch

    from .library_settings import settings
    m = torch.backends.cuda.matmul
    return settings((m, "allow_fp16_reduced_precision_reduction", False),
                     (m, "allow_bf16_reduced_precision_reduction", False))


def run_low_precision(program: Program, node_id: str, env: dict, form: str) -> None:
    """run_node for a matmul / linear / convolution node in `form` (one of FORMS)."""
    from ..reference import run_node
    from .library_settings import tf32_tensor_cores
    node = program.nodes[node_id]
    if form == TF32:
        with tf32_tensor_cores():
            run_node(program, node_id, env)
        return
    dtype = _dtype(form)
    ins = [env[v].to(dtype) if v else None for v in node.inputs]
    with _fp32_accumulation():
        out = node.opdef.reference(ins, node.attrs)
    env[node.outputs[0]] = out.float()


def cast_bytes(program: Program, node_id: str, form: str) -> int:
    """Temporaries one call in `form` allocates beyond its fp32 output: the half-precision copies of
    its operands and of its result (none for TF32)."""
    if form == TF32:
        return 0
    node = program.nodes[node_id]
    return sum(program.values[v].nbytes // 2 for v in list(node.inputs) + list(node.outputs) if v)
