"""Every bundled example imports, validates, round-trips through the project file and matches PyTorch.

The examples in resources/examples/ are KernelBench-format programs (Model, get_inputs,
get_init_inputs). For each one: import_file builds the Program; it must validate with no errors and
hold no opaque node beyond those ALLOWED_OPAQUE lists for it (each named in the import warnings);
save/load must reproduce the same JSON and the same results; and the reference interpreter
must match the original module on three draws of the file's own get_inputs() (seeds 0, 1, 2), plus
one draw from the program's own input hints (what the studio verifies against).
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest
import torch

from agent_core.importers import import_file, verify_import
from agent_core.project_file import load_program, program_to_json, save_program
from agent_core.reference import run_reference

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "resources" / "examples"
EXAMPLES = sorted(p for p in EXAMPLES_DIR.glob("*.py") if not p.name.startswith("_"))
ATOL = RTOL = 1e-4
SEED = 0  # the seed import_file builds the model with (its default)

# Opaque nodes an example may hold, by file name -> {torch operator: why}. Each one must also be
# named in metadata["import_warnings"]; any other opaque node fails the test.
# Deliberate: none of the examples uses an op outside the library on purpose.
# Known gaps (the importer or the op library does not express the op yet): once closed, the
# example imports with no opaque node and the test keeps passing; then delete the entry.
ALLOWED_OPAQUE: dict[str, dict[str, str]] = {
    "reduce_max_min_prod.py": {
        "aten.prod.dim_int": "importer gap: dim arrives as a list, the library's prod takes one int"},
}


def _ids(paths):
    return [p.stem for p in paths]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The examples are small: one intra-op thread avoids oversubscribing a shared CI machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def _imported(path: Path):
    """(program, the source module, the model with the same weights the importer used)."""
    program = import_file(path, seed=SEED)
    spec = importlib.util.spec_from_file_location(f"_example_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(SEED)
    init_args = mod.get_init_inputs()
    torch.manual_seed(SEED)
    model = mod.Model(*init_args).eval()
    return program, mod, model


def _draw(mod, seed: int) -> list:
    torch.manual_seed(seed)
    return list(mod.get_inputs())


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _opaque_ops(program) -> set[str]:
    """The torch operator behind each opaque node (its target attribute, e.g. aten.foo.default)."""
    return {str(n.attrs.get("target")) for n in program.nodes.values() if n.op == "opaque"}


def test_enough_examples_with_a_readme_line_each():
    assert len(EXAMPLES) >= 36
    readme = (EXAMPLES_DIR / "README.md").read_text()
    missing = [p.name for p in EXAMPLES if f"`{p.name}`" not in readme]
    assert not missing, f"resources/examples/README.md has no line for {missing}"
    assert (EXAMPLES_DIR / "mlp_block.py").exists()  # the Makefile's default studio example
    stale = [name for name in ALLOWED_OPAQUE if not (EXAMPLES_DIR / name).exists()]
    assert not stale, f"ALLOWED_OPAQUE names examples that do not exist: {stale}"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_imports_and_validates(path):
    program, _, _ = _imported(path)
    errors = [d for d in program.validate() if d.severity == "error"]
    assert not errors, "; ".join(d.message for d in errors)
    assert program.outputs, "the imported program has no outputs"
    opaque = _opaque_ops(program)
    allowed = ALLOWED_OPAQUE.get(path.name, {})
    unexpected = sorted(opaque - set(allowed))
    assert not unexpected, f"opaque nodes: {unexpected}; warnings: {program.metadata.get('import_warnings')}"
    warnings = " ".join(program.metadata.get("import_warnings") or [])
    for op in opaque:
        assert op in warnings, f"the import warnings do not name the opaque op {op}: {warnings!r}"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_round_trips_through_the_project_file(path, tmp_path):
    program, mod, _ = _imported(path)
    file = tmp_path / f"{path.stem}.json"
    save_program(program, file)
    loaded = load_program(file)
    assert program_to_json(loaded) == program_to_json(program)
    # Parameters travel too (inline or in the sidecar): the loaded program computes the same bits.
    inputs = [t for t in _draw(mod, 0) if isinstance(t, torch.Tensor)]
    before = run_reference(program, inputs)
    after = run_reference(loaded, inputs)
    assert list(before) == list(after)
    for name in before:
        assert torch.equal(before[name], after[name]), f"output {name} changed after save/load"


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_reference_matches_pytorch(path):
    program, mod, model = _imported(path)
    for seed in (0, 1, 2):
        args = _draw(mod, seed)
        with torch.no_grad():
            want = _outputs(model(*args))
        got = run_reference(program, [a for a in args if isinstance(a, torch.Tensor)])
        assert len(got) == len(want), f"{len(got)} program outputs for {len(want)} module outputs"
        for (name, g), w in zip(got.items(), want):
            assert g.shape == w.shape, f"seed {seed}, output {name}: shape {list(g.shape)} != {list(w.shape)}"
            assert g.dtype == w.dtype, f"seed {seed}, output {name}: dtype {g.dtype} != {w.dtype}"
            if w.is_floating_point():
                err = float((g - w).abs().max()) if w.numel() else 0.0
                assert torch.allclose(g, w, atol=ATOL, rtol=RTOL), f"seed {seed}, output {name}: max error {err:.3g}"
            else:
                assert torch.equal(g, w), f"seed {seed}, output {name}: integer results differ"
    # The program's own input hints (what the studio draws from) must also give matching results.
    verify_import(program, model, draws=1, atol=ATOL, rtol=RTOL)
