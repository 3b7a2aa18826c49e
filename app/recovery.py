"""Autosave: a recovery copy of each open document, written while it has unsaved changes and removed
when it is saved or closed cleanly. Files left behind after a crash are offered for restoring."""
from __future__ import annotations

import hashlib
import json
import os
import time

from PySide6.QtCore import QStandardPaths

from agent_core.project_file import dumps, loads


def recovery_dir() -> str:
    base = QStandardPaths.writableLocation(QStandardPaths.AppDataLocation) or os.path.expanduser("~/.stitchcuda")
    path = os.path.join(base, "recovery")
    os.makedirs(path, exist_ok=True)
    return path


def key_for(path: str | None, session: str) -> str:
    """One recovery file per saved path, or per untitled document of this session."""
    src = os.path.abspath(path) if path else f"untitled-{session}"
    return hashlib.sha1(src.encode()).hexdigest()[:16]


def write(program, path: str | None, session: str) -> str:
    """Atomically write the recovery copy; returns its path."""
    target = os.path.join(recovery_dir(), key_for(path, session) + ".recovery.json")
    record = {"original": path, "saved_at": time.time(), "program": dumps(program)}
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, target)
    return target


def remove(path: str | None, session: str) -> None:
    target = os.path.join(recovery_dir(), key_for(path, session) + ".recovery.json")
    if os.path.exists(target):
        os.remove(target)


def pending() -> list[dict]:
    """Recovery files on disk (left by a crash), newest first: {file, original, saved_at}."""
    out = []
    folder = recovery_dir()
    for name in os.listdir(folder):
        if not name.endswith(".recovery.json"):
            continue
        full = os.path.join(folder, name)
        try:
            with open(full, encoding="utf-8") as f:
                rec = json.load(f)
            out.append({"file": full, "original": rec.get("original"), "saved_at": rec.get("saved_at", 0)})
        except (OSError, ValueError):
            continue  # a half-written or foreign file is not a recovery we can offer
    return sorted(out, key=lambda r: -r["saved_at"])


def restore(file: str):
    """(program, original path) from a recovery file; FileFormatError if it is damaged."""
    with open(file, encoding="utf-8") as f:
        rec = json.load(f)
    return loads(rec["program"]), rec.get("original")
