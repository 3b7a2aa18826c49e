"""Autosave: a recovery copy of each open document, written while it has unsaved changes and removed
when it is saved or closed cleanly. Copies left behind after a crash are offered for restoring.

A copy is an ordinary project file (large parameters in its .npz sidecar, written atomically by
agent_core.project_file) plus a small .meta.json naming the document it belongs to.

The folder is read at every start, so nothing in it may stop the studio: `scan()` checks each copy
(its note is a JSON object with a numeric saved_at and a string or null original; all its parts are
there, regular files, not links, of a sane size, with UTF-8 names) and sets a damaged one aside
(renamed NAME.bad-<timestamp>, never deleted) with a one-line notice for the window to show.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import time
from dataclasses import dataclass, field

from PySide6.QtCore import QStandardPaths

from agent_core.project_file import MAX_FILE_BYTES, TMP_SUFFIX, load_program, save_program

from .quarantine import is_set_aside, is_utf8, set_aside, shown

META, PROGRAM, SIDECAR = ".meta.json", ".json", ".json.npz"
PARTS = (META, SIDECAR, PROGRAM)     # ".json" last: the other two end with it or contain it
MAX_META_BYTES = 64 << 10            # the note is two fields; anything near this is not ours
MAX_PATH_CHARS = 4096


class Damaged(Exception):
    """Why a recovery copy cannot be offered (one line, without the file's name)."""


@dataclass
class Scan:
    entries: list[dict] = field(default_factory=list)   # {file, original, saved_at}, newest first
    notices: list[str] = field(default_factory=list)    # one line per copy (or stray file) set aside


def recovery_dir() -> str:
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or os.path.expanduser("~/.stitchcuda")
    path = os.path.join(base, "recovery")
    os.makedirs(path, exist_ok=True)
    return path


def _stem(path: str | None, session: str) -> str:
    """One recovery copy per saved path, or per untitled document of this session."""
    src = os.path.abspath(path) if path else f"untitled-{session}"
    return os.path.join(recovery_dir(), hashlib.sha1(src.encode("utf-8", "surrogateescape")).hexdigest()[:16])


def write(program, path: str | None, session: str) -> str:
    """Write the recovery copy; returns the project file's path."""
    stem = _stem(path, session)
    save_program(program, stem + PROGRAM)
    meta = {"original": path, "saved_at": time.time()}
    tmp = stem + META + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    os.replace(tmp, stem + META)
    return stem + PROGRAM


def remove(path: str | None, session: str) -> None:
    """Best effort: a copy that cannot be removed is offered (or set aside) at the next start."""
    try:
        _remove_stem(_stem(path, session))
    except OSError:
        pass


def _remove_stem(stem: str) -> None:
    for ext in PARTS:
        if os.path.lexists(stem + ext):
            os.remove(stem + ext)


def scan() -> Scan:
    """The copies that can be offered, newest first, and a notice for each damaged one set aside."""
    out = Scan()
    folder = _checked_folder(out.notices)
    if folder is None:
        return out
    stems: dict[str, set[str]] = {}
    for name in sorted(os.listdir(folder)):
        if is_set_aside(name) or name.startswith(".") or name.endswith((".tmp", TMP_SUFFIX)):
            continue   # set aside before, or a save in progress (project_file cleans its orphans)
        if not is_utf8(name):
            out.notices.append(_set_aside_files(os.path.join(folder, name), [""], "its name is not UTF-8"))
            continue
        part = next((p for p in PARTS if name.endswith(p)), None)
        if part is not None:   # anything else is not a recovery file and is left alone
            stems.setdefault(name[: -len(part)], set()).add(part)
    for stem, parts in stems.items():
        base = os.path.join(folder, stem)
        try:
            out.entries.append(_entry(base, parts))
        except Damaged as e:
            out.notices.append(_set_aside_files(base, [p for p in PARTS if p in parts], str(e)))
    out.entries.sort(key=lambda r: -r["saved_at"])
    return out


def pending() -> list[dict]:
    """scan()'s entries, for callers that do not show its notices."""
    return scan().entries


def discard(file: str) -> None:
    _remove_stem(file[: -len(PROGRAM)])


def restore(file: str):
    """(program, original path) from a recovery copy; Damaged, FileFormatError or OSError if it is damaged."""
    stem = file[: -len(PROGRAM)]
    meta = _read_meta(stem)
    _regular(file, MAX_FILE_BYTES)
    return load_program(file), meta["original"]


def set_aside_copy(file: str, why: str) -> str:
    """Set a copy aside that scan() passed but that turned out unusable (its program does not load)."""
    stem = file[: -len(PROGRAM)]
    return _set_aside_files(stem, [p for p in PARTS if os.path.lexists(stem + p)], why)


# checks --------------------------------------------------------------------------------------------
def _checked_folder(notices: list[str]) -> str | None:
    """The folder itself: a file or a link where it belongs is set aside and a fresh folder made."""
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or os.path.expanduser("~/.stitchcuda")
    path = os.path.join(base, "recovery")
    try:
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            notices.append(f"Recovery folder {path} was set aside as {shown(set_aside(path))}: it is not a folder")
        return recovery_dir()
    except OSError as e:
        notices.append(f"Recovery folder {path} cannot be used ({e.strerror or e}); autosave is off until it can")
        return None


def _entry(stem: str, parts: set[str]) -> dict:
    if META not in parts:
        raise Damaged("its note (.meta.json) is missing" if PROGRAM in parts
                      else "a parameter sidecar without its program copy")
    if PROGRAM not in parts:
        raise Damaged("its program copy (.json) is missing")
    if SIDECAR in parts:
        _regular(stem + SIDECAR, None)
    _regular(stem + PROGRAM, MAX_FILE_BYTES)
    meta = _read_meta(stem)
    return {"file": stem + PROGRAM, "original": meta["original"], "saved_at": meta["saved_at"]}


def _regular(path: str, limit: int | None) -> None:
    """A plain file (a link, folder or pipe is refused before it is opened: a pipe would block)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise Damaged(f"{shown(path)} cannot be read ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode):
        raise Damaged(f"{shown(path)} is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise Damaged(f"{shown(path)} is not a regular file")
    if limit is not None and st.st_size > limit:
        raise Damaged(f"{shown(path)} is {st.st_size:,} bytes, more than the {limit:,} it may have")


def _read_meta(stem: str) -> dict:
    path = stem + META
    _regular(path, MAX_META_BYTES)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_META_BYTES + 1)   # bounded even if the file grew since lstat
    except OSError as e:
        raise Damaged(f"its note cannot be read ({e.strerror or e})") from None
    if len(raw) > MAX_META_BYTES:
        raise Damaged(f"its note is larger than {MAX_META_BYTES:,} bytes")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise Damaged("its note is not UTF-8 text") from None
    except ValueError as e:
        raise Damaged(f"its note is not JSON ({e})") from None
    except RecursionError:
        raise Damaged("its note is nested too deeply to be JSON the studio wrote") from None
    if not isinstance(meta, dict):
        raise Damaged(f"its note is a JSON {type(meta).__name__}, not an object")
    saved = meta.get("saved_at")
    try:   # an integer too large for a float is no time either
        seconds = float(saved) if isinstance(saved, (int, float)) and not isinstance(saved, bool) else math.nan
    except OverflowError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise Damaged(f"its saved_at is not a number of seconds: {_short(saved)}")
    original = meta.get("original")
    if original is not None and not _is_path(original):
        raise Damaged(f"its original is not a file path or null: {_short(original)}")
    return {"original": original, "saved_at": seconds}


def _is_path(value) -> bool:
    """What the restored document can be saved to (and named after) without an encoding error."""
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_PATH_CHARS:
        return False
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        return False
    return True


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _set_aside_files(stem: str, parts: list[str], why: str) -> str:
    """Rename each part; the notice names the first file, why, and where it went."""
    moved, failed = [], None
    for p in parts:
        try:
            moved.append(set_aside(stem + p))
        except OSError as e:
            failed = f"{shown(stem + p)}: {e.strerror or e}"
    first = shown(stem + parts[0])
    if failed:
        return f"Recovery copy {first} is damaged ({why}) and could not be set aside ({failed}); it is ignored"
    others = f" (with {len(moved) - 1} more of its files)" if len(moved) > 1 else ""
    return f"Recovery copy {first} was set aside as {shown(moved[0])}{others}: {why}"
