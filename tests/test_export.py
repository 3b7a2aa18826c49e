"""Export: every bundled example either exports or is listed with its reason; exports build with CMake
and nvcc for sm_90 (no GPU needed: configure and compile); the data round-trips through the manifest.

A representative subset (BUILD_SUBSET) is built the way a user builds an export, each in its own CMake
tree. Beyond those, the exports that together hold every kind of generated code (each kind of step,
each kernel kind and schedule, aliases, scratch buffers, each input and output dtype: `features`) are
built as subdirectories of one shared tree, which configures once; building all 56 took 160 s of CI's
two cores for code the cover already compiles.
"""
from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agent_core.cli import main as cli_main
from agent_core.export import ExportError, export_program
from agent_core.importers import import_file
from agent_core.ir import Program
from agent_core.output_dir import OutputRefused
from agent_core.reference import run_reference

EXAMPLES = Path(__file__).resolve().parent.parent / "resources" / "examples"

# what CI builds: a transformer block (cuBLAS linear + bias with epilogues, strided-batched GEMMs, slices,
# layout kernels, layer norm), pooling, and a split reduction with two scratch buffers (hinge_loss)
BUILD_SUBSET = ("transformer_block", "max_pool2d", "hinge_loss")


def _nvcc_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    root = Path(nvcc).resolve().parent.parent
    for inc in (root / "include", root / "targets" / "x86_64-linux" / "include"):
        if (inc / "cuda_runtime.h").exists():
            return inc
    return None


def cublas_cmake_args(scratch: Path) -> list[str] | None:
    """CMake arguments that make CUDA::cublas resolve: none when the toolkit has cuBLAS, else a prefix
    over the nvidia-cublas wheel (CI's toolkit has nvcc and cudart only); None if neither exists."""
    inc = _nvcc_include()
    if inc is not None and (inc / "cublas_v2.h").exists():
        return []
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    for base in (Path(p) / "cu13" for p in (spec.submodule_search_locations if spec else [])):
        if (base / "include" / "cublas_v2.h").exists() and (base / "lib" / "libcublas.so.13").exists():
            lib = scratch / "cublas_lib"
            lib.mkdir(parents=True, exist_ok=True)
            for name, target in (("libcublas.so", "libcublas.so.13"), ("libcublas.so.13", "libcublas.so.13"),
                                 ("libcublasLt.so.13", "libcublasLt.so.13")):
                if not (lib / name).exists():
                    (lib / name).symlink_to(base / "lib" / target)
            # the kernels (nvcc) and the host files (the C++ compiler) both include cublas_v2.h
            return [f"-DCMAKE_LIBRARY_PATH={lib}", f"-DCMAKE_CUDA_FLAGS=-I{base / 'include'}",
                    f"-DCMAKE_CXX_FLAGS=-I{base / 'include'}"]
    return None


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.py"))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Every example exported once: name -> ExportResult or the ExportError message."""
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name in example_names():
        program = import_file(str(EXAMPLES / f"{name}.py"))
        try:
            out[name] = export_program(program, root / name)
        except ExportError as exc:
            out[name] = str(exc)
    return out


def test_every_example_exports(exports):
    refused = {n: r for n, r in exports.items() if isinstance(r, str)}
    assert not refused, f"examples the export refuses: {refused}"
    supported = list(exports)
    for name in supported:
        files = set(exports[name].files)
        assert {"CMakeLists.txt", "stitch_program.h", "stitch_program.cpp", "main.cpp", "README.md",
                "manifest.json", "python/stitch_program.py", "stitch_capi.cpp"} <= files


def test_no_kernel_reads_a_buffer_it_writes(exports):
    """A view between two ops of a region is computed in its kernel, never passed in as an input that
    aliases one of the kernel's own outputs (transformer_block: slice -> reshape -> transpose)."""
    for name, res in exports.items():
        if isinstance(res, str):
            continue
        base = res.schedule.base
        for step in res.schedule.steps:
            if step.kind == "kernel":
                assert not set(map(base, step.reads)) & set(map(base, step.writes)), (name, step.name)


def test_convolutions_are_generated_and_the_readme_says_how(exports, tmp_path):
    """For sm_80 and newer a convolution and its epilogue are one implicit-GEMM kernel on the tensor
    cores, and CMake refuses an older target; exported for sm_75 they are one direct convolution."""
    kinds = lambda res: [s.kernel.kind for s in res.schedule.steps if s.kernel is not None]
    res = exports["conv2d_bias_relu"]
    assert kinds(res) == ["gemm"], kinds(res)  # conv, bias and relu in one kernel
    readme = (res.outdir / "README.md").read_text()
    assert "implicit GEMMs on the tensor cores" in readme and "no cuDNN is linked" in readme
    cmake = (res.outdir / "CMakeLists.txt").read_text()
    assert "need sm_80 or newer" in cmake and "FATAL_ERROR" in cmake
    assert "no cuDNN" not in (exports["softmax_rows"].outdir / "README.md").read_text()
    old = export_program(import_file(str(EXAMPLES / "conv2d_bias_relu.py")), tmp_path / "sm75", arch="75")
    assert kinds(old) == ["convolution"], kinds(old)
    assert "direct convolutions in fp32" in (old.outdir / "README.md").read_text()
    assert "FATAL_ERROR" not in (old.outdir / "CMakeLists.txt").read_text()
    # a transposed convolution is a direct one on every target, in the launch the agent times first
    convs = [s.kernel for s in exports["conv_transpose3d_small"].schedule.steps
             if s.kernel is not None and s.kernel.kind == "convolution"]
    assert convs and all(k.params["stage_weights"] for k in convs), [k.params for k in convs]


def test_generated_sources_read_like_hand_written_code(exports):
    for name, res in exports.items():
        if isinstance(res, str):
            continue
        for step in res.schedule.steps:
            if step.kind != "kernel":
                continue
            text = (res.outdir / "kernels" / f"{step.name}.cu").read_text()
            assert "// Fused ops:" in text and "__restrict__" in text and f"launch_{step.name}(" in text
            assert "TODO" not in text
        header = (res.outdir / "stitch_program.h").read_text()
        assert "int stitch_run(const StitchInputs& inputs, const StitchParameters& params" in header
        assert "constexpr size_t kWorkspaceBytes" in header
        compile((res.outdir / "python" / "stitch_program.py").read_text(), "stitch_program.py", "exec")
        cmake = (res.outdir / "CMakeLists.txt").read_text()
        assert "cmake_minimum_required(VERSION 3.24)" in cmake and "LANGUAGES CXX CUDA" in cmake
        assert ("CUDA::cublas" in cmake) == res.schedule.uses_cublas


def test_memory_plan_never_shares_bytes_between_live_values(exports):
    for name, res in exports.items():
        if isinstance(res, str):
            continue
        bufs = list(res.memory.arena.values())
        for i, a in enumerate(bufs):
            assert a.offset % 256 == 0
            for b in bufs[i + 1:]:
                if a.first <= b.last and b.first <= a.last:  # both live at some launch
                    assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (name, a, b)
        assert res.memory.activation_bytes <= res.memory.unshared_bytes


def _read(root: Path, entry: dict) -> np.ndarray:
    return np.fromfile(root / entry["file"], dtype=np.dtype(entry["dtype"]).newbyteorder("<")).reshape(entry["shape"])


def test_data_round_trips_through_the_manifest(exports):
    """Inputs and parameters read back with numpy, run through the reference, give the saved outputs."""
    for name in ("mlp_block", "transformer_block"):
        res = exports[name]
        manifest = json.loads((res.outdir / "manifest.json").read_text())
        program = import_file(str(EXAMPLES / f"{name}.py"))
        inputs = {e["name"]: _read(res.outdir, e) for e in manifest["inputs"]}
        import torch
        params = {e["value_id"]: torch.from_numpy(_read(res.outdir, e).copy()) for e in manifest["parameters"]}
        assert set(params) == {v.id for v in program.values.values() if v.role.value == "parameter"}
        outs = run_reference(program, {k: torch.from_numpy(v.copy()) for k, v in inputs.items()}, params=params)
        for e in manifest["outputs"]:
            np.testing.assert_allclose(_read(res.outdir, e), outs[e["name"]].numpy(), rtol=1e-6, atol=1e-6)
        assert manifest["workspace"]["bytes"] == res.memory.arena_bytes
        assert [launch["name"] for launch in manifest["launches"]] == [s.name for s in res.schedule.steps]


def test_no_params_leaves_parameters_out(tmp_path):
    program = import_file(str(EXAMPLES / "mlp_block.py"))
    res = export_program(program, tmp_path / "e", params=False)
    assert not (tmp_path / "e" / "data" / "parameters").exists()
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert manifest["parameters"] and not any(p["included"] for p in manifest["parameters"])
    assert "add_test" not in "\n".join(l for l in (tmp_path / "e" / "CMakeLists.txt").read_text().splitlines()
                                       if not l.startswith("#"))
    assert "--no-params" in (tmp_path / "e" / "README.md").read_text()
    assert res.data_bytes < sum(v.nbytes for v in program.values.values() if v.role.value == "parameter")


def test_program_file_without_regions_is_planned(tmp_path):
    from agent_core.project_file import save_program
    program = import_file(str(EXAMPLES / "softmax_rows.py"))
    program.regions = []
    save_program(program, str(tmp_path / "p.json"))
    assert cli_main(["export", str(tmp_path / "p.json"), "-o", str(tmp_path / "e")]) == 0
    assert list((tmp_path / "e" / "kernels").glob("*softmax*.cu"))


def test_refusal_names_the_ops(tmp_path, capsys):
    model = tmp_path / "sorted_rows.py"  # torch.sort has no library op: it imports as an opaque node
    model.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                     "        return torch.sort(x, dim=1).values.relu()\n\n"
                     "def get_inputs():\n    return [torch.randn(4, 33)]\n\ndef get_init_inputs():\n    return []\n")
    assert cli_main(["export", str(model), "-o", str(tmp_path / "e")]) == 1
    err = capsys.readouterr().err
    assert "opaque" in err and "sort" in err and len(err.strip().splitlines()) == 1


def test_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "keep.txt").write_text("mine")
    program = import_file(str(EXAMPLES / "softmax_rows.py"))
    with pytest.raises(OutputRefused, match="not empty.*keep.txt"):
        export_program(program, tmp_path / "e")
    assert (tmp_path / "e" / "keep.txt").read_text() == "mine"


def test_split_reduction_scratch_lives_after_the_activations(tmp_path):
    p = Program("long_rows")
    x = p.add_input("x", (4, 262144))
    s = p.add_node("sum", [x.id], {"dim": [1]})
    p.mark_output(s.outputs[0])
    res = export_program(p, tmp_path / "e")
    assert res.memory.scratch, "a few very long rows should use the split schedule"
    assert all(off >= res.memory.activation_bytes for *_, off in res.memory.scratch)
    assert "zeroed once" in (tmp_path / "e" / "stitch_program.h").read_text()


def one_tree(top: Path, exports: dict[str, Path]) -> Path:
    """A CMake tree holding every export as a subdirectory (its targets are named after its program, so
    they do not collide): the compilers are detected once, and one build compiles them all."""
    top.mkdir()
    (top / "CMakeLists.txt").write_text("\n".join(
        ["cmake_minimum_required(VERSION 3.24)", "project(all_exports LANGUAGES CXX CUDA)", "enable_testing()"]
        + [f'add_subdirectory("{path}" "{name}")' for name, path in exports.items()]) + "\n")
    return top


def build_export(outdir: Path, cmake_args: list[str], jobs: int = 1) -> float:
    """Configure and compile an export for sm_90; returns the seconds it took."""
    t0 = time.perf_counter()
    build = outdir / "build"
    for cmd in (["cmake", "-S", str(outdir), "-B", str(build), "-DCMAKE_CUDA_ARCHITECTURES=90", *cmake_args],
                ["cmake", "--build", str(build), f"-j{jobs}"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


NEEDS_BUILD_TOOLS = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nvcc") is None,
                                       reason="needs cmake and nvcc")


def _supported(exports, cublas) -> list[str]:
    names = [n for n, r in exports.items() if not isinstance(r, str)]
    missing = [n for n in names if exports[n].schedule.uses_cublas and cublas is None]
    assert not missing, f"cuBLAS headers not found (toolkit or nvidia-cublas wheel); cannot build: {missing}"
    return names


@NEEDS_BUILD_TOOLS
def test_exports_build_standalone_with_cmake_for_sm90(exports, tmp_path):
    """A few exports built the way a user builds one: its own CMake tree, configured and compiled."""
    cublas = cublas_cmake_args(tmp_path)
    names = [n for n in _supported(exports, cublas) if n in BUILD_SUBSET]
    assert len(names) == len(BUILD_SUBSET)
    # two builds at a time, one compiler each: CI has two cores
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        times = dict(zip(names, pool.map(
            lambda n: build_export(exports[n].outdir, cublas if exports[n].schedule.uses_cublas else []), names)))
    print("\nbuilt " + ", ".join(f"{n} {t:.0f}s" for n, t in sorted(times.items())), file=sys.stderr)
    for n in names:
        build = exports[n].outdir / "build"
        assert (build / "stitch_driver").exists() and (build / "libstitch_program.so").exists()


def features(res) -> set:
    """What kinds of generated code an export holds: its step kinds, each kernel's kind and schedule,
    whether values alias or scratch buffers exist, and the dtypes of what it reads and returns."""
    out = {("step", s.kind) for s in res.schedule.steps}
    out |= {("kernel", s.kernel.kind, str((s.kernel.params or {}).get("schedule")))
            for s in res.schedule.steps if s.kernel is not None}
    out |= {"aliases"} if res.schedule.aliases else set()
    out |= {"scratch"} if res.memory.scratch else set()
    manifest = json.loads((res.outdir / "manifest.json").read_text())
    out |= {(part, v["dtype"]) for part in ("inputs", "parameters", "outputs") for v in manifest[part]}
    return out


def feature_cover(exports: dict, names: list[str], covered: set) -> list[str]:
    """Exports, greedily, until every feature of `names` beyond `covered` is held by one of them."""
    feats = {n: features(exports[n]) for n in names}
    left = set().union(*feats.values()) - covered
    chosen = []
    while left:
        best = max(sorted(feats), key=lambda n: len(feats[n] & left))
        chosen.append(best)
        left -= feats[best]
    return chosen


def test_the_cover_holds_every_feature_and_skips_the_repeats(exports):
    names = [n for n, r in exports.items() if not isinstance(r, str)]
    standalone = set().union(*(features(exports[n]) for n in BUILD_SUBSET))
    cover = feature_cover(exports, [n for n in names if n not in BUILD_SUBSET], standalone)
    held = standalone.union(*(features(exports[n]) for n in cover))
    assert held == set().union(*(features(exports[n]) for n in names))
    assert {("step", "gemm"), ("step", "kernel"), "scratch"} <= held and len(cover) < len(names) // 2, cover


@NEEDS_BUILD_TOOLS
@pytest.mark.parametrize("half", [0, 1])
def test_every_kind_of_export_builds_in_one_cmake_tree(exports, tmp_path, half):
    """Beyond the standalone builds above, the exports that hold every remaining feature, as
    subdirectories of one CMake tree: one configure (the compilers are detected once), then their
    sources compiled for sm_90, two at a time. The targets are named after their program, so the
    exports do not collide. Two halves, so that pytest-xdist can build them on both cores."""
    cublas = cublas_cmake_args(tmp_path)
    supported = _supported(exports, cublas)
    standalone = set().union(*(features(exports[n]) for n in BUILD_SUBSET))
    names = feature_cover(exports, [n for n in supported if n not in BUILD_SUBSET], standalone)[half::2]
    top = one_tree(tmp_path / "all_exports", {n: exports[n].outdir for n in names})
    seconds = build_export(top, cublas or [], jobs=2)
    print(f"\nbuilt {len(names)} exports in one tree in {seconds:.0f} s", file=sys.stderr)
    for n in names:
        assert (top / "build" / n / "stitch_driver").exists() and (top / "build" / n / "libstitch_program.so").exists()


def test_outputs_that_alias_inputs_or_each_other_are_copied(tmp_path):
    p = Program("aliases")
    x = p.add_input("x", (4, 8))
    flat = p.add_node("reshape", [x.id], {"shape": [32]})
    r = p.add_node("relu", [x.id])
    r_flat = p.add_node("reshape", [r.outputs[0]], {"shape": [32]})
    for v in (flat.outputs[0], r.outputs[0], r_flat.outputs[0]):
        p.mark_output(v)
    res = export_program(p, tmp_path / "e")
    assert not res.memory.arena  # relu writes straight into its output buffer
    source = (tmp_path / "e" / "stitch_program.cpp").read_text()
    assert "cudaMemcpyAsync(outputs.reshape, inputs.x, 128" in source
    assert "cudaMemcpyAsync(outputs.reshape_1, outputs.relu, 128" in source


def test_two_scratch_buffers_of_one_kernel_get_their_own_names(tmp_path):
    p = Program("long_rows_mean")
    x = p.add_input("x", (2, 1_000_000))      # 8 MB in 2 rows: split over the GPU (a float and a counter workspace)
    m = p.add_node("mean", [x.id], {"dim": [1]})
    p.mark_output(m.outputs[0])
    export_program(p, tmp_path / "e")
    header = (tmp_path / "e" / "stitch_program.h").read_text()
    names = [line.split()[2] for line in header.splitlines() if "zeroed once" in line]
    assert len(names) == 2 and len(set(names)) == 2, names
    source = (tmp_path / "e" / "stitch_program.cpp").read_text()
    assert all(f"stitch_memory::{n})" in source for n in names)


def test_large_data_gets_a_size_warning(tmp_path, monkeypatch):
    import agent_core.export as export
    monkeypatch.setattr(export, "SIZE_WARNING_BYTES", 1000)
    res = export.export_program(import_file(str(EXAMPLES / "mlp_block.py")), tmp_path / "e")
    assert res.warnings and "--no-params" in res.warnings[0]


def test_an_optimized_program_with_attention_left_to_torch_is_lowered_and_planned_again(tmp_path):
    # optimize leaves attention over 64 MiB of scores to torch; the export has no such path
    from agent_core.planner.plan import apply_plan, plan_program
    p = Program("long_attention")
    q, k, v = (p.add_input(n, (1, 8, 2048, 64)).id for n in "qkv")
    p.mark_output(p.add_node("scaled_dot_product_attention", [q, k, v], {"is_causal": True}).outputs[0])
    apply_plan(p, plan_program(p))
    assert p.regions
    res = export_program(p, tmp_path / "e")
    assert [s.kind for s in res.schedule.steps].count("gemm") == 2  # q @ k^T and the product with v
