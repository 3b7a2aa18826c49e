"""`bench --resume`: the rows an earlier run of the same --json file finished, so they are not run again.

A driver stopped hard (kill -9, a lost machine) may leave half a line at the end of the file; it is cut
off before this run appends, so the file stays one JSON object per line. Rows recorded as skipped (the
time cap) are not finished and run again; failed rows are finished (they ran, and the reason is kept).
"""
from __future__ import annotations

import json
import os


def _cut_partial_line(path: str) -> None:
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def finished_rows(path: str) -> dict[str, dict]:
    """Absolute file path -> its row, for every finished row of the JSON-lines file (none if absent)."""
    if not os.path.exists(path):
        return {}
    _cut_partial_line(path)
    out = {}
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("file") and not rec.get("skipped"):
                out[os.path.abspath(rec["file"])] = rec
    return out
