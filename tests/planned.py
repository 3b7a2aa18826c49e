"""`stitchcuda plan` of the tests' own model files, run in the test's process.

The CLI imports a .py file in a fresh child interpreter (agent_core.importers.isolated) after its own
start: torch loaded twice, about 7 s a call on CI's two cores, and the planner tests made 76 such calls.
They check what the planner makes, not the CLI (tests/test_cli.py and the hostile-input tests drive the
CLI as a subprocess), and they import only this repository's files, so here the file is imported in
this process by what the child runs (importers.import_file) and planned by the CLI's own plan_loaded.
Each (file, options) is planned once per test process; every call gets its own copy of the program.
"""
from __future__ import annotations

import copy
import functools
import os
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = ROOT / "benchmarks" / "blocks"
SMALL = "STITCHCUDA_BLOCKS_SMALL"      # the blocks' test sizes (read when a block file runs)


@contextmanager
def _blocks_at(small: bool):
    old = os.environ.get(SMALL)
    if small:
        os.environ[SMALL] = "1"
    else:
        os.environ.pop(SMALL, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SMALL, None)
        else:
            os.environ[SMALL] = old


@functools.lru_cache(maxsize=None)
def _planned(path: str, small: bool, check: bool, rewrite: bool) -> tuple[dict, str]:
    from agent_core.commands.plan import plan_loaded
    from agent_core.importers import import_file
    from agent_core.project_file import dumps
    with _blocks_at(small):
        program = import_file(path)
    done = plan_loaded(program, label=path, rewrite=rewrite, check=check)
    return done.to_dict(), dumps(done.program)


def plan(path, *, small: bool = True, check: bool = True, rewrite: bool = True):
    """(`plan --json`'s dict, the planned program as `plan -o` saves it) for a .py model file;
    small: the benchmark blocks at their test sizes; check=False is `--no-check`."""
    from agent_core.project_file import loads
    as_dict, text = _planned(str(path), small, check, rewrite)
    return copy.deepcopy(as_dict), loads(text)


def block(name: str) -> Path:
    return BLOCKS / f"{name}.py"
