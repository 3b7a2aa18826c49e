"""The public suite of real-world blocks (benchmarks/blocks/, KernelBench format) is usable as a benchmark.

For every block file, at the reduced sizes STITCHCUDA_BLOCKS_SMALL=1 selects (the real sizes are
too slow for the CPU reference): import_file builds a valid program with no opaque node, and the program
matches the module on two draws from the program's own input hints (what `stitchcuda bench`
verifies against) and one from the file's get_inputs(). At the real sizes, built on the meta device
so nothing is allocated: inputs and parameters stay under the 4 GB budget, and the default really is
the real size (every input at least as large as its test-size twin). The README's table lists
exactly the files there are.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import pytest
import torch

from agent_core.importers import import_file, verify_import
from agent_core.importers.source import load_source

BLOCKS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "blocks"
BLOCKS = sorted(BLOCKS_DIR.glob("*.py"))
SMALL_ENV = "STITCHCUDA_BLOCKS_SMALL"
SEED = 0  # import_file's default seed: the model below gets the same weights
BUDGET_BYTES = 4 * 10 ** 9  # inputs + parameters of one block at its real size (drawn on the host first)

# Opaque nodes a block may hold, file name -> {torch operator: why}. None: every block is written in
# ops the importer maps (the README lists the importer gaps the blocks were written around).
ALLOWED_OPAQUE: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _small_and_one_thread():
    """Test sizes for every import in this file, one intra-op thread on a shared CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SMALL_ENV, "1")
        yield
    torch.set_num_threads(threads)


def _load(path: Path, small: bool):
    """The block's module, executed with or without the size override."""
    saved = os.environ.pop(SMALL_ENV, None)
    try:
        if small:
            os.environ[SMALL_ENV] = "1"
        return load_source(path)
    finally:
        os.environ.pop(SMALL_ENV, None)
        if saved is not None:
            os.environ[SMALL_ENV] = saved


@functools.lru_cache(maxsize=None)
def _imported(path: Path):
    """(program, module, model with the importer's weights), all at the test sizes."""
    program = import_file(path, seed=SEED)
    mod = _load(path, small=True)
    torch.manual_seed(SEED)
    init_args = mod.get_init_inputs()
    torch.manual_seed(SEED)
    return program, mod, mod.Model(*init_args).eval()


def test_at_least_thirty_blocks():
    assert len(BLOCKS) >= 30, f"benchmarks/blocks holds {len(BLOCKS)} blocks; the suite promises 30 or more"


@pytest.mark.parametrize("path", BLOCKS, ids=[p.stem for p in BLOCKS])
def test_block_imports_without_opaque_nodes_and_matches_the_module(path):
    program, mod, model = _imported(path)
    errors = [d for d in program.validate() if d.severity == "error"]
    assert not errors, f"{path.name}: {errors[0]}"
    opaque = {str(n.attrs.get("target")) for n in program.nodes.values() if n.op == "opaque"}
    allowed = set(ALLOWED_OPAQUE.get(path.name, {}))
    assert opaque <= allowed, f"{path.name}: opaque nodes {sorted(opaque - allowed)}"
    verify_import(program, model, draws=2, atol=1e-4, rtol=1e-4)

    def own_draw(seed):
        torch.manual_seed(seed)
        return mod.get_inputs()
    verify_import(program, model, own_draw, draws=1, atol=1e-4, rtol=1e-4)


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("path", BLOCKS, ids=[p.stem for p in BLOCKS])
def test_real_size_is_the_default_and_fits_the_budget(path):
    real, small = _load(path, small=False), _load(path, small=True)
    with torch.device("meta"):
        real_inputs = list(real.get_inputs())
        model = real.Model(*real.get_init_inputs())
        small_inputs = list(small.get_inputs())
    held = _tensor_bytes(real_inputs) + _tensor_bytes(list(model.parameters()) + list(model.buffers()))
    assert held <= BUDGET_BYTES, f"{path.name}: inputs and parameters take {held / 1e9:.2f} GB at the real size"
    assert len(real_inputs) == len(small_inputs)
    for r, s in zip(real_inputs, small_inputs):
        assert r.numel() >= s.numel(), f"{path.name}: an input is smaller at the default size than under {SMALL_ENV}"
    assert sum(r.numel() for r in real_inputs) > sum(s.numel() for s in small_inputs), (
        f"{path.name}: the default size is the test size; the default must be the model's real size")


def test_readme_table_lists_every_block():
    readme = (BLOCKS_DIR / "README.md").read_text()
    listed = re.findall(r"^\|\s*`([\w.]+\.py)`\s*\|", readme, flags=re.MULTILINE)
    assert len(listed) == len(set(listed)), "a block is listed twice in benchmarks/blocks/README.md"
    files = {p.name for p in BLOCKS}
    assert set(listed) == files, (f"README.md table: missing {sorted(files - set(listed))}, "
                                  f"stale {sorted(set(listed) - files)}")
