"""Helpers of the hostile-input tests (tests/test_hostile_*.py): a folder's exact state, so a test can
assert that a bad input left every file it did not own as it was."""
from __future__ import annotations

import hashlib
import os
import stat
from contextlib import contextmanager
from pathlib import Path


def snapshot(folder) -> dict[str, tuple]:
    """Every entry under `folder` (not following links): relative path -> (kind, mode, content hash or
    link target). Two equal snapshots mean nothing was created, removed, changed or re-permissioned."""
    folder = Path(folder)
    out: dict[str, tuple] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            elif not stat.S_ISREG(st.st_mode):  # a FIFO or device: reading it would hang or never end
                out[rel] = ("special", stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@contextmanager
def unchanged(folder, *, ignore=()):
    """Asserts on exit that `folder` is exactly as it was on entry (entries whose relative path starts
    with one of `ignore` aside: the output a test expects the tool to write)."""
    def keep(snap):
        return {k: v for k, v in snap.items() if not any(k == i or k.startswith(i.rstrip("/") + "/")
                                                          for i in ignore)}
    before = keep(snapshot(folder))
    yield
    after = keep(snapshot(folder))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{folder}: changed {changed[:10]}"
