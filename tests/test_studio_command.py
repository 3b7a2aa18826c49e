"""`stitchcuda studio` where the studio cannot start: a missing xcb library is named with the package
that brings it, instead of Qt aborting the process with "could not load the Qt platform plugin xcb"."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent_core.commands.studio import debian_package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join(ROOT, "tests", "data", "residual_add_layer_norm_cpu", "program.json")


@pytest.mark.parametrize("soname, package", [
    ("libxcb-cursor.so.0", "libxcb-cursor0"), ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"), ("libdbus-1.so.3", "libdbus-1-3"), ("libEGL.so.1", "libegl1"),
    ("libX11-xcb.so.1", "libx11-xcb1")])
def test_a_library_is_named_by_its_debian_package(soname, package):
    assert debian_package(soname) == package


def _studio(tmp_path, ldd_says: str):
    """`stitchcuda studio PROGRAM` on an X display, with an `ldd` on PATH that reports `ldd_says`."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ldd").write_text(f"#!/bin/sh\nprintf '%s\\n' '{ldd_says}'\n")
    (fake / "ldd").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=":97", PATH=f"{fake}{os.pathsep}{env['PATH']}", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "agent_core.cli", "studio", PROGRAM], capture_output=True,
                          text=True, env=env, timeout=120)


def test_a_missing_xcb_library_is_named_with_its_package_and_the_summary_is_shown(tmp_path):
    pytest.importorskip("PySide6")
    res = _studio(tmp_path, "\tlibxcb-cursor.so.0 => not found")
    assert res.returncode == 0, res.stderr
    assert "residual" in res.stdout.lower()                  # the program's summary instead of the window
    assert "libxcb-cursor.so.0" in res.stderr and "sudo apt-get install libxcb-cursor0" in res.stderr
    assert "could not load the Qt platform plugin" not in res.stderr


def test_with_every_library_found_the_check_does_not_stand_in_the_way(tmp_path):
    # ldd finds everything; the editor then tries the (absent) display itself, and the check stays quiet
    pytest.importorskip("PySide6")
    res = _studio(tmp_path, "\tlibxcb-cursor.so.0 => /usr/lib/x86_64-linux-gnu/libxcb-cursor.so.0 (0x1)")
    assert "apt-get install" not in res.stderr


def test_the_headless_install_needs_no_qt_and_the_studio_extra_brings_it():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    core = " ".join(project["dependencies"]).lower()
    assert "pyside" not in core and "pyqtgraph" not in core and "qt" not in core.replace("nvrtc", "")
    studio = " ".join(project["optional-dependencies"]["studio"]).lower()
    assert "pyside6" in studio and "pyqtgraph" in studio


def test_without_the_studio_packages_the_command_says_what_to_install():
    # PySide6 made unimportable, as on a GPU server that installed only `pip install .`
    code = ("import sys; sys.modules['PySide6'] = None; from agent_core.cli import main; "
            f"sys.exit(main(['studio', {PROGRAM!r}, '--screenshot', 'never.png']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    assert "PySide6 is missing" in res.stderr and "stitchcuda[studio]" in res.stderr, res.stderr
    assert "residual" in res.stdout.lower() and not os.path.exists(os.path.join(ROOT, "never.png"))
