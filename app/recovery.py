"""Autosave: a recovery copy of each open document, written while it has unsaved changes and removed
when it is saved or closed cleanly. Copies left behind after a crash are offered for restoring.

A copy is an ordinary project file (large parameters in its .npz sidecar, written atomically by
agent_core.project_file) plus a small .meta.json naming the document it belongs to.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

from PySide6.QtCore import QStandardPaths

from agent_core.project_file import load_program, save_program


def recovery_dir() -> str:
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or os.path.expanduser("~/.stitchcuda")
    path = os.path.join(base, "recovery")
    os.makedirs(path, exist_ok=True)
    return path


def _stem(path: str | None, session: str) -> str:
    """One recovery copy per saved path, or per untitled document of this session."""
    src = os.path.abspath(path) if path else f"untitled-{session}"
    return os.path.join(recovery_dir(), hashlib.sha1(src.encode()).hexdigest()[:16])


def write(program, path: str | None, session: str) -> str:
    """Write the recovery copy; returns the project file's path."""
    stem = _stem(path, session)
    save_program(program, stem + ".json")
    meta = {"original": path, "saved_at": time.time()}
    tmp = stem + ".meta.json.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    os.replace(tmp, stem + ".meta.json")
    return stem + ".json"


def remove(path: str | None, session: str) -> None:
    _remove_stem(_stem(path, session))


def _remove_stem(stem: str) -> None:
    for ext in (".meta.json", ".json", ".json.npz"):
        if os.path.exists(stem + ext):
            os.remove(stem + ext)


def pending() -> list[dict]:
    """Recovery copies on disk (left by a crash), newest first: {file, original, saved_at}."""
    out = []
    folder = recovery_dir()
    for name in os.listdir(folder):
        if not name.endswith(".meta.json"):
            continue
        stem = os.path.join(folder, name[: -len(".meta.json")])
        try:
            with open(stem + ".meta.json", encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue  # a half-written or foreign file is not a recovery we can offer
        if os.path.exists(stem + ".json"):
            out.append({"file": stem + ".json", "original": meta.get("original"),
                        "saved_at": meta.get("saved_at", 0)})
    return sorted(out, key=lambda r: -r["saved_at"])


def discard(file: str) -> None:
    _remove_stem(file[: -len(".json")])


def restore(file: str):
    """(program, original path) from a recovery copy; FileFormatError if it is damaged."""
    with open(file[: -len(".json")] + ".meta.json", encoding="utf-8") as f:
        meta = json.load(f)
    return load_program(file), meta.get("original")
