"""The launch sequence of an exported program: what runs, in which order, reading and writing what.

Each active region becomes one generated kernel when codegen can write it. A region that starts with
a matmul runs it through cuBLAS and fuses the rest into an epilogue kernel; one that starts with a
convolution becomes one generated convolution kernel with the rest fused into it (the export links
no cuDNN): the implicit GEMM on the tensor cores in split TF32 (codegen/gemm_conv.py) where it takes
the region and the target has them (sm_80 and newer), else a direct convolution in fp32. Anything else
is split into its nodes: views cost nothing (they alias their input), matmul / linear / bmm run through
cuBLAS, contiguous slices and concatenations are strided copies, and every other node becomes a
single-node generated kernel. A node with none of these paths (an
opaque op) makes the export refuse, naming it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..analysis.cost import is_view
from ..codegen import CodegenError, KernelSource, generate_kernel, region_io, split_library
from ..errors import StitchError
from ..ir import Program
from ..planner.execute import region_groups, region_order
from ..regions import active_regions

GEMM_OPS = ("matmul", "bmm", "linear")
COPY_OPS = ("slice", "cat")
INT32_MAX = 2**31 - 1  # cuBLAS takes int dimensions and strides


class ExportError(StitchError):
    """The program cannot be exported (an op with no CUDA path, a shape cuBLAS cannot take)."""


@dataclass
class Step:
    """One launch (or library call) of the exported program."""
    kind: str                    # "kernel", "gemm", "copy"
    name: str                    # the kernel / launch name, a C identifier
    reads: list[str]             # value ids
    writes: list[str]
    node_ids: list[str]
    region_id: str | None = None
    reason: str = ""             # why it runs this way (README, header comments)
    kernel: KernelSource | None = None
    node: str | None = None      # the node a gemm / copy step computes


@dataclass
class Schedule:
    steps: list[Step]
    aliases: dict[str, str]      # view value id -> the value whose memory it shares
    notes: list[str] = field(default_factory=list)  # per-region decisions, for the README

    def base(self, vid: str) -> str:
        return self.aliases.get(vid, vid)

    @property
    def uses_cublas(self) -> bool:
        return any(s.kind == "gemm" for s in self.steps)

    @property
    def uses_tensor_cores(self) -> bool:
        """A generated kernel runs mma.sync TF32 (the implicit-GEMM convolution): sm_80 and newer."""
        return any(s.kernel is not None and s.kernel.kind == "gemm" for s in self.steps)


def c_ident(text: str) -> str:
    ident = re.sub(r"\W", "_", text).strip("_") or "v"
    return ident if not ident[0].isdigit() else "v" + ident


def _region_name(program: Program, rid: str, nodes: list[str]) -> str:
    ops = list(dict.fromkeys(program.nodes[n].op for n in nodes if not is_view(program, n)))
    return c_ident(f"{rid}_{'_'.join(ops[:3])}")


def build_schedule(program: Program, arch: str = "90") -> Schedule:
    """The launch sequence for the program's active regions (nodes outside any region run alone), for
    CUDA architecture `arch` (CMake's form: "90")."""
    regions = active_regions(program)
    groups = region_groups(program, regions)
    region_ids = [r.id for r in regions] + [f"n_{g[0]}" for g in groups[len(regions):]]
    aliases: dict[str, str] = {}
    steps: list[Step] = []
    notes: list[str] = []
    refused: list[str] = []
    taken: set[str] = set()

    def unique(name: str) -> str:
        cand, k = name, 1
        while cand in taken:
            cand, k = f"{name}_{k}", k + 1
        taken.add(cand)
        return cand

    for gi in region_order(program, groups):
        nodes, rid = region_io(program, groups[gi]).nodes, region_ids[gi]
        real = kernel_nodes(program, nodes)
        for n in nodes:
            if n not in real:
                node = program.nodes[n]
                aliases[node.outputs[0]] = aliases.get(node.inputs[0], node.inputs[0])
        if not real:
            notes.append(f"{rid}: views only ({', '.join(program.nodes[n].op for n in nodes)}); no launch")
            continue
        made = _whole_region(program, rid, real, unique, arch)
        if made is not None:
            steps += made
            notes.append(f"{rid}: {made[-1].reason}")
            continue
        for n in real:
            try:
                steps.append(_single(program, rid, n, unique, arch))
            except (CodegenError, ExportError) as exc:
                node = program.nodes[n]
                refused.append(f"{node.name} ({node.op}): {exc}")
        if len(real) == 1 and steps and steps[-1].node_ids == real:
            notes.append(f"{rid}: {steps[-1].reason}")
        elif len(real) > 1:
            notes.append(f"{rid}: split into its {len(real)} nodes (the region as a whole has no generator)")
    if refused:
        raise ExportError(f"{len(refused)} node(s) have no CUDA path in the export: " + "; ".join(refused))
    return Schedule(steps, aliases, notes)


def kernel_nodes(program: Program, nodes: list[str]) -> list[str]:
    """The region's nodes its kernel computes: every non-view, and every view between two of them
    (RoPE's slice -> reshape -> transpose). Views at the region's edge alias their input and cost
    nothing; one in the middle read as a kernel input would alias a buffer the kernel is writing."""
    view = {n for n in nodes if is_view(program, n)}
    made = {v for n in nodes if n not in view for v in program.nodes[n].outputs}
    for n in nodes:                       # topological: a view of a view of a computed value is computed
        if n in view and program.nodes[n].inputs[0] in made:
            made.update(program.nodes[n].outputs)
    read = {v for n in nodes if n not in view for v in program.nodes[n].inputs if v}
    for n in reversed(nodes):             # a view read (through views) by a computed node is needed
        if n in view and any(v in read for v in program.nodes[n].outputs):
            read.add(program.nodes[n].inputs[0])
    return [n for n in nodes if n not in view or (program.nodes[n].inputs[0] in made
                                                  and any(v in read for v in program.nodes[n].outputs))]


def _whole_region(program: Program, rid: str, real: list[str], unique, arch: str) -> list[Step] | None:
    """The region as one kernel, or one cuBLAS call plus its fused epilogue kernel; None if neither."""
    try:
        io = region_io(program, real)
        lib, rest = split_library(program, io)
    except CodegenError:
        return None
    try:
        if lib and program.nodes[lib[0]].opdef.category == "convolution":
            # no cuDNN in the export: the convolution is generated, with its epilogue inside the kernel
            ks = _conv_kernel(program, real, unique(_region_name(program, rid, real)), arch)
            return [_kernel_step(rid, ks, f"generated {ks.kind} kernel of {len(real)} op(s) ({ks.schedule})")]
        if lib:
            gemm = _gemm_step(program, rid, lib[0], unique)
            ks = generate_kernel(program, rest, name=unique(_region_name(program, rid, rest)))
            anchor = program.nodes[lib[0]]
            ks.source = (f"// Runs after {anchor.name} ({anchor.op} -> {program.values[anchor.outputs[0]].spec}) "
                         f"through cuBLAS; this kernel is its fused epilogue.\n") + ks.source
            return [gemm, _kernel_step(rid, ks, f"cuBLAS {anchor.op} with a fused epilogue kernel ({ks.schedule})")]
        ks = generate_kernel(program, real, name=unique(_region_name(program, rid, real)))
    except (CodegenError, ExportError):
        return None
    return [_kernel_step(rid, ks, f"{ks.kind} kernel of {len(real)} op(s) ({ks.schedule})")]


def tensor_cores(arch: str) -> bool:
    """Whether every architecture in CMake's list ("80;90", "90a") has mma.sync TF32 (sm_80 and
    newer); "native" or "all" may not."""
    nums = [re.match(r"\d+", a.strip()) for a in str(arch).split(";")]
    return all(m is not None and int(m.group()) >= 80 for m in nums)


def _conv_kernel(program: Program, nodes: list[str], name: str, arch: str) -> KernelSource:
    """A convolution region's kernel: the implicit GEMM (split TF32 on the tensor cores, fp32-accurate
    within the check's 1e-4) where it takes the region and the target has mma.sync TF32, else the
    direct convolution (fp32 on the FMA units, and the only form of a depthwise or transposed one), in
    the launch the agent times first where its reduction is short (staged weights, several positions a
    thread: conv.direct_alternative), else its plain default."""
    from ..codegen.conv import direct_alternative
    from ..codegen.gemm_mma import FORM, gemm_supported
    from ..codegen.region_io import region_io
    if tensor_cores(arch) and gemm_supported(program, nodes) is None:
        return generate_kernel(program, nodes, name=name, params={"form": FORM})
    first = direct_alternative(program, region_io(program, nodes))[:1]
    return generate_kernel(program, nodes, name=name, kind="convolution", params=first[0] if first else None)


def _kernel_step(rid: str, ks: KernelSource, reason: str) -> Step:
    return Step("kernel", ks.name, list(ks.inputs), list(ks.outputs), list(ks.node_ids), rid, reason, kernel=ks)


def _single(program: Program, rid: str, nid: str, unique, arch: str) -> Step:
    node = program.nodes[nid]
    if node.op in GEMM_OPS:
        return _gemm_step(program, rid, nid, unique)
    if node.op in COPY_OPS and node.attrs.get("step", 1) == 1:  # a slice with a step is a generated kernel
        return _copy_step(program, rid, nid, unique)
    if node.opdef.category == "matmul":
        raise ExportError(f"only {', '.join(GEMM_OPS)} map onto cuBLAS calls in the export")
    name = unique(c_ident(f"{rid}_{node.name}"))
    ks = (_conv_kernel(program, [nid], name, arch) if node.opdef.category == "convolution"
          else generate_kernel(program, [nid], name=name))
    return _kernel_step(rid, ks, f"single-node {ks.kind} kernel ({ks.schedule})")


def _float32(program: Program, vids) -> None:
    for v in vids:
        if v is not None and program.values[v].dtype != "float32":
            raise ExportError(f"{program.values[v].name} is {program.values[v].dtype}; cuBLAS calls here are float32")


def gemm_dims(program: Program, nid: str) -> dict:
    """The cuBLAS call that computes a matmul / bmm / linear node on contiguous row-major tensors:
    batch, m, n, k and the element strides between batches of a, b and c (0: shared by every batch)."""
    node = program.nodes[nid]
    _float32(program, list(node.inputs) + list(node.outputs))
    a = tuple(program.values[node.inputs[0]].shape)
    b = tuple(program.values[node.inputs[1]].shape)
    if node.op == "linear":  # y[..., N] = x[..., K] @ W[N, K]^T
        k, n = a[-1], b[0]
        m = math.prod(a[:-1])
        dims = dict(batch=1, m=m, n=n, k=k, stride_a=0, stride_b=0, stride_c=0, transpose_b=True)
    else:
        a2 = (1,) + a if len(a) == 1 else a
        b2 = b + (1,) if len(b) == 1 else b
        m, k, n = a2[-2], a2[-1], b2[-1]
        ba, bb = a2[:-2], b2[:-2]
        if math.prod(bb) == 1:  # b is one matrix: fold a's batch into its rows
            dims = dict(batch=1, m=math.prod(ba) * m, n=n, k=k, stride_a=0, stride_b=0, stride_c=0)
        elif ba == bb:
            dims = dict(batch=math.prod(bb), m=m, n=n, k=k, stride_a=m * k, stride_b=k * n, stride_c=m * n)
        elif math.prod(ba) == 1:
            dims = dict(batch=math.prod(bb), m=m, n=n, k=k, stride_a=0, stride_b=k * n, stride_c=m * n)
        else:
            raise ExportError(f"{node.name} ({node.op}): batch dimensions {list(ba)} and {list(bb)} broadcast "
                              f"partially; only equal or single-matrix batches map onto one cuBLAS call")
        dims["transpose_b"] = False
    too_big = [key for key in ("m", "n", "k", "stride_a", "stride_b", "stride_c") if dims[key] > INT32_MAX]
    if too_big:
        raise ExportError(f"{node.name} ({node.op}): {', '.join(too_big)} exceed cuBLAS's int range")
    dims["bias"] = node.op == "linear" and len(node.inputs) > 2 and node.inputs[2] is not None
    return dims


def _gemm_step(program: Program, rid: str, nid: str, unique) -> Step:
    node = program.nodes[nid]
    dims = gemm_dims(program, nid)
    call = "cublasSgemmStridedBatched" if dims["batch"] > 1 else "cublasSgemm"
    reads = [v for v in node.inputs if v is not None]
    return Step("gemm", unique(c_ident(f"{rid}_{node.name}")), reads, list(node.outputs), [nid], rid,
                f"{node.op} through {call} (fp32, no TF32)", node=nid)


def _copy_step(program: Program, rid: str, nid: str, unique) -> Step:
    node = program.nodes[nid]
    reads = [v for v in node.inputs if v is not None]
    return Step("copy", unique(c_ident(f"{rid}_{node.name}")), reads, list(node.outputs), [nid], rid,
                f"{node.op} as cudaMemcpy2DAsync row copies", node=nid)
