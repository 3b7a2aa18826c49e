"""The folders `export` and `optimize` write: never a partial one, never over what the tool did not write.

    with output_folder("out", "export", force=args.force, protect=input_paths(args.program)) as tmp:
        ...write every file into tmp...
    # out now holds exactly what was written, with its marker; a failure left out as it was

A run writes into a fresh folder beside the target (same parent, so the final move is a rename) and
moves it into place only when it succeeded; an exception anywhere (Ctrl+C included) removes it and
leaves the target untouched. Each folder produced carries MARKER (JSON: tool, kind, the files
written). An existing target is replaced only when it is empty, or when it carries a valid marker and
holds nothing the marker does not list (and `force` is given, or the kind allows replacing its own
output, as optimize does). The current folder, the home folder, `/`, the folder holding an input and
any ancestor of these are never written; nor is a symbolic link, a file, or a folder with a symlink in
it. Replacing moves the old folder aside, moves the new one in, then deletes the old one; if the move
in fails, the old one is put back. See docs/EXPORT.md.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .errors import StitchError

MARKER = ".stitchcuda-output"
TOOL = "stitchcuda"
KINDS = ("export", "optimize")
MARKER_MAX_BYTES = 4 << 20          # a marker lists file names; anything larger is not ours
SHOWN = 5                           # foreign files named in a refusal


class OutputRefused(StitchError):
    """The output folder may not be written or replaced; the message says why and what to do."""


def input_paths(spec) -> list[str]:
    """The files a command reads its program from (a program file and its `.npz` sidecar), which the
    output may never replace; none for `module:Class`."""
    spec = os.fspath(spec)
    return [p for p in (spec, spec + ".npz") if os.path.lexists(p)]


def _real(path: str) -> str:
    """The real path of `path` without following its last component (a link there is refused)."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(os.path.realpath(parent), name) if name else os.path.realpath(parent)


def _is_within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _protected_reason(real: str, protect) -> str | None:
    """Why `real` (a real path) may never be an output folder, or None."""
    if real == os.sep:
        return "it is the root folder"
    cwd = os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if real == cwd:
        return "it is the current folder"
    if real == home:
        return "it is your home folder"
    if _is_within(cwd, real):
        return "it holds the current folder"
    if _is_within(home, real):
        return "it holds your home folder"
    for p in protect:
        for form in {os.path.abspath(p), os.path.realpath(p)}:   # the link and what it points at
            if form == real:
                return f"it is the input {p}"
            if _is_within(form, real):
                return f"it holds the input {p}"
    return None


def read_marker(folder) -> dict | None:
    """The folder's marker as a dict (tool, kind, files), or None when it has no valid one."""
    path = os.path.join(folder, MARKER)
    try:
        if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) > MARKER_MAX_BYTES:
            return None
        with open(path, encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    if (not isinstance(marker, dict) or marker.get("tool") != TOOL or marker.get("kind") not in KINDS
            or not isinstance(marker.get("files"), list) or not all(isinstance(f, str) for f in marker["files"])):
        return None
    return marker


def foreign_files(folder) -> list[str]:
    """Entries under `folder` (relative paths; folders end in '/') that its marker does not list: all
    of them when it has no valid marker. A symlink is always foreign (the tool writes none), and a
    subfolder that carries its own valid marker (optimize --sanitize's run) is judged by that one."""
    marker = read_marker(folder)
    listed = set(marker["files"]) if marker else set()
    dirs = {str(Path(f).parent) for f in listed}
    dirs = {str(p) for d in dirs for p in [Path(d), *Path(d).parents]}
    out: list[str] = []

    def walk(rel: str) -> None:
        with os.scandir(os.path.join(folder, rel) if rel else folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            if e.is_symlink():
                out.append(r)
            elif e.is_dir():
                if marker is not None and r in dirs:
                    walk(r)
                elif marker is not None and read_marker(e.path) is not None:
                    out.extend(f"{r}/{f}" for f in foreign_files(e.path))
                else:
                    out.append(r + "/")
            elif r not in listed:
                out.append(r)
    walk("")
    return [f for f in out if f != MARKER]


def _names(files: list[str]) -> str:
    more = f" (and {len(files) - SHOWN} more)" if len(files) > SHOWN else ""
    return ", ".join(files[:SHOWN]) + more


def check_target(target, kind: str, *, force: bool = False, protect=(), hint: str | None = "--force") -> bool:
    """Raise OutputRefused unless `kind`'s output may go to `target`; True when an existing folder will
    be replaced. `hint` is how the caller asks for force (None where it cannot)."""
    target = os.fspath(target) or "."
    if os.path.islink(target):
        raise OutputRefused(f"{target}: is a symbolic link (to {os.readlink(target)}); the output is never "
                            "written through a link: name a real folder")
    why = _protected_reason(_real(target), protect)
    if why:
        raise OutputRefused(f"{target}: refusing to write the {kind} here ({why}); choose a new or empty folder")
    if not os.path.lexists(target):
        return False
    if not os.path.isdir(target):
        raise OutputRefused(f"{target}: is a file, not a folder; choose a new or empty folder for the {kind}")
    if not os.listdir(target):
        return True
    marker = read_marker(target)
    foreign = foreign_files(target)
    ours = marker is not None and not foreign
    if ours and (force or (kind == "optimize" and marker["kind"] == "optimize")):
        return True
    if ours:
        ask = f"; pass {hint} to replace it" if hint else "; choose a new or empty folder"
        raise OutputRefused(f"{target}: is not empty (it holds an earlier {marker['kind']} by {TOOL}){ask}")
    if marker is None:
        raise OutputRefused(f"{target}: is not empty and {TOOL} did not write it (no {MARKER} marker; it holds "
                            f"{_names(foreign)}); choose a new or empty folder")
    raise OutputRefused(f"{target}: is not empty and holds files {TOOL} did not write ({_names(foreign)}); "
                        "move them out or choose a new or empty folder")


def _fresh_beside(target: str, tag: str) -> str:
    """A new, empty folder in target's parent (made with the user's umask, unlike mkdtemp's 0700)."""
    parent, name = os.path.split(os.path.abspath(target))
    while True:
        path = os.path.join(parent, f".{name}.{TOOL}-{tag}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue


def _make_parents(target: str) -> list[str]:
    """Create target's missing ancestors; the ones created, deepest first (removed again on failure)."""
    made = []
    parent = os.path.dirname(os.path.abspath(target))
    while not os.path.isdir(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    for p in reversed(made):
        os.mkdir(p)
    return made


def written_files(folder) -> list[str]:
    """Every file under `folder`, relative, sorted (the fresh folder holds only what the run wrote)."""
    out = []
    for root, _dirs, files in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, f), folder) for f in files]
    return sorted(f for f in out if f != MARKER)


def write_marker(folder, kind: str, files=None) -> None:
    files = written_files(folder) if files is None else sorted(files)
    Path(folder, MARKER).write_text(json.dumps({"tool": TOOL, "kind": kind, "files": files}, indent=1) + "\n")


def add_to_marker(folder, files) -> None:
    """List more files the tool wrote into an output already in place (optimize --sanitize's report)."""
    marker = read_marker(folder)
    if marker is None:
        raise OutputRefused(f"{folder}: its {MARKER} marker is missing or broken")
    write_marker(folder, marker["kind"], set(marker["files"]) | set(files))


def _move_in(fresh: str, target: str) -> None:
    """Put `fresh` at `target`: an existing target is moved aside first, and back if the move fails."""
    aside = None
    if os.path.lexists(target):
        aside = _fresh_beside(target, "old")
        os.rmdir(aside)            # a name only: rename needs it free
        os.rename(target, aside)
    try:
        os.rename(fresh, target)
    except BaseException:
        if aside is not None:
            os.rename(aside, target)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def output_folder(target, kind: str, *, force: bool = False, protect=(), hint: str | None = "--force"):
    """Yield a fresh folder (a Path) beside `target` to write `kind`'s output into; on success mark it
    and move it to `target`; on any exception remove it (and parents it created) and leave `target`
    exactly as it was. The target is checked on entry and again just before it is replaced."""
    assert kind in KINDS
    target = os.fspath(target)
    check_target(target, kind, force=force, protect=protect, hint=hint)
    made = _make_parents(target)
    fresh = _fresh_beside(target, "new")
    try:
        yield Path(fresh)
        write_marker(fresh, kind)
        # a user may have put files into the target while the run went on
        check_target(target, kind, force=force, protect=protect, hint=hint)
        _move_in(fresh, target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        for p in made:
            try:
                os.rmdir(p)
            except OSError:
                break
        raise


__all__ = ["MARKER", "OutputRefused", "add_to_marker", "check_target", "foreign_files", "input_paths",
           "output_folder", "read_marker"]
