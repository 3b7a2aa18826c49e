"""Export a program as a standalone CUDA project: kernels, entry point, memory plan, driver, CMake,
Python binding, README and the data to test it on.

    from agent_core.export import export_program
    result = export_program(program, "out/", params=True, arch="90")

The program is planned first if it has no regions. The project is written into a fresh folder beside
`out/` and moved into place when complete (agent_core.output_dir): a failed export leaves `out/` as it
was, and `overwrite` replaces only an earlier output of this tool. See docs/EXPORT.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir import Program
from ..output_dir import output_folder
from .driver import TOLERANCE, capi_source, driver_source
from .host import BIAS_KERNEL, HostNames, ProgramSource, kernel_file, kernels_header
from .memory import MemoryPlan, plan_memory
from .project import cmake_lists, python_binding, readme
from .steps import ExportError, Schedule, build_schedule, gemm_dims

SIZE_WARNING_BYTES = 100 * 2**20  # data/ above this gets a warning (use --no-params for large models)
MANIFEST_VERSION = 1


@dataclass
class ExportResult:
    outdir: Path
    schedule: Schedule
    memory: MemoryPlan
    files: list[str]                   # paths relative to outdir
    data_bytes: int
    warnings: list[str] = field(default_factory=list)


def _lower_composites(program: Program) -> Program:
    """Losses, cross entropy and attention written out as the ops they are (agent_core.rewrites.lowering),
    as `stitchcuda optimize` does: the kernels cannot take them whole. An optimized program can still
    hold one (optimize leaves a large attention to torch); its regions are then dropped and the
    lowered program planned again, since they name ops that are gone."""
    from ..rewrites.lowering import LOWERED, lower_all
    if not any(n.op in LOWERED for n in program.nodes.values()):
        return program
    from ..rewrites import rewrite_program
    return rewrite_program(program, rules=[lower_all], check=False).program


def _ensure_regions(program: Program) -> None:
    if not program.regions:
        from ..planner import apply_plan, plan_program
        apply_plan(program, plan_program(program))


def _reference_data(program: Program, seed: int):
    """Inputs (seed `seed`), parameters and the reference outputs, as numpy arrays by value id."""
    import torch

    from ..reference import parameter_tensors, random_inputs, run_reference
    inputs = random_inputs(program, seed=seed)
    params = parameter_tensors(program)
    outs = run_reference(program, inputs, device="cpu", params=params)
    arrays = {vid: inputs[program.values[vid].name] for vid in program.inputs}
    arrays.update(params)
    arrays.update({vid: outs[program.values[vid].name] for vid in program.outputs})
    return {vid: t.detach().contiguous().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
            for vid, t in arrays.items()}


def _write_raw(path: Path, arr: np.ndarray, dtype: str) -> int:
    arr = np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<"))
    path.parent.mkdir(parents=True, exist_ok=True)
    arr.tofile(path)
    return arr.nbytes


def export_program(program: Program, outdir, *, params: bool = True, arch: str = "90", seed: int = 0,
                   overwrite: bool = False, protect=(), hint: str | None = "--force") -> ExportResult:
    """Write the CUDA project for `program` into `outdir` (ExportError says why it cannot, OutputRefused
    why `outdir` may not be written). overwrite: replace an earlier output of this tool there; protect:
    the files the program came from, which the output may never replace; hint: how the caller asks for
    overwrite, named in a refusal (None where it cannot)."""
    program.check()
    with output_folder(outdir, "export", force=overwrite, protect=protect, hint=hint) as tmp:
        result = _export_into(program, Path(tmp), params=params, arch=arch, seed=seed)
    result.outdir = Path(outdir)
    return result


def _export_into(program: Program, out: Path, *, params: bool, arch: str, seed: int) -> ExportResult:
    program = _lower_composites(program)
    _ensure_regions(program)
    schedule = build_schedule(program, arch)
    memory = plan_memory(program, schedule)
    names = HostNames.of(program)
    src = ProgramSource(program, schedule, memory, names)

    files: dict[str, str] = {}
    for vid in src.inputs:
        files[vid] = f"inputs/{names[vid]}.bin"
    for vid in src.params:
        files[vid] = f"parameters/{names[vid]}.bin"
    for vid in src.outputs:
        files["ref:" + vid] = f"reference/{names[vid]}.bin"

    written: list[str] = []

    def write(rel: str, text: str) -> None:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(rel)

    kernel_files = []
    for step in schedule.steps:
        if step.kind == "kernel":
            rel = f"kernels/{step.kernel.filename}"
            write(rel, kernel_file(step))
            kernel_files.append(rel)
    bias = any(s.kind == "gemm" and gemm_dims(program, s.node)["bias"] for s in schedule.steps)
    if bias:
        write("kernels/broadcast_bias_rows.cu", BIAS_KERNEL)
        kernel_files.append("kernels/broadcast_bias_rows.cu")
    write("stitch_kernels.h", kernels_header(schedule, bias))
    write("stitch_program.h", src.header())
    write("stitch_program.cpp", src.source())
    write("stitch_capi.cpp", capi_source(program, src))
    write("main.cpp", driver_source(program, src, files))
    write("python/stitch_program.py", python_binding(program, src, files))

    arrays = _reference_data(program, seed)
    data_bytes = 0
    for vid in src.inputs + [v for v in src.params if _included(program, v, params)]:
        data_bytes += _write_raw(out / "data" / files[vid], arrays[vid], program.values[vid].dtype)
    for vid in src.outputs:
        data_bytes += _write_raw(out / "data" / files["ref:" + vid], arrays[vid], program.values[vid].dtype)
    warnings = []
    if data_bytes > SIZE_WARNING_BYTES:
        warnings.append(f"data/ holds {data_bytes / 2**20:.0f} MiB"
                        + ("; export with --no-params to leave the parameters out" if params else ""))
    write("CMakeLists.txt", cmake_lists(program, schedule, kernel_files, arch, params))
    write("README.md", readme(program, schedule, memory, arch, params, data_bytes))
    write("manifest.json", json.dumps(_manifest(program, schedule, memory, src, files, params, arch), indent=1) + "\n")
    return ExportResult(out, schedule, memory, written, data_bytes, warnings)


def _included(program: Program, vid: str, params: bool) -> bool:
    """Parameters go into data/ unless left out (--no-params); constants the program made (the causal
    mask of a lowered attention) always do: the user has no other source for them."""
    return params or program.values[vid].role.value == "constant"


def _manifest(program: Program, schedule: Schedule, memory: MemoryPlan, src: ProgramSource, files: dict,
              params: bool, arch: str) -> dict:
    def entry(vid, file_key=None):
        v = program.values[vid]
        return {"name": v.name, "value_id": vid, "field": src.n[vid], "shape": list(v.shape), "dtype": v.dtype,
                "bytes": v.nbytes, "file": "data/" + files[file_key or vid]}
    return {
        "manifest_version": MANIFEST_VERSION, "program": program.name, "cuda_architectures": arch,
        "byte_order": "little", "layout": "contiguous row-major", "tolerance": {"atol": TOLERANCE, "rtol": TOLERANCE},
        "inputs": [entry(v) for v in src.inputs],
        "parameters": [dict(entry(v), included=_included(program, v, params)) for v in src.params],
        "outputs": [dict(entry(v, "ref:" + v), reference=True) for v in src.outputs],
        "workspace": {"bytes": memory.arena_bytes, "activation_bytes": memory.activation_bytes,
                      "unshared_bytes": memory.unshared_bytes,
                      "values": [{"name": program.values[b.value_id].name, "value_id": b.value_id,
                                  "offset": b.offset, "bytes": b.nbytes, "first_launch": b.first,
                                  "last_launch": b.last} for b in sorted(memory.arena.values(), key=lambda x: x.offset)],
                      "scratch": [{"kernel": k, "dtype": d, "elements": n, "offset": o}
                                  for k, d, n, o in memory.scratch]},
        "launches": [{"name": s.name, "kind": s.kind, "region": s.region_id, "reason": s.reason,
                      "nodes": s.node_ids} for s in schedule.steps],
    }


__all__ = ["ExportError", "ExportResult", "export_program"]
