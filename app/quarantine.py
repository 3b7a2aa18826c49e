"""Setting a damaged start-up file aside: a recovery copy or a settings file the studio cannot use is
renamed to NAME.bad-<timestamp> (never deleted: the user may want it back, and a bug in a check must
not cost data), so the next start does not trip over it again."""
from __future__ import annotations

import os
import time

MARK = ".bad-"


def is_set_aside(name: str) -> bool:
    return MARK in name


def set_aside(path: str) -> str:
    """Rename `path` (a file, a link or a folder; a link is renamed, never followed) beside itself to
    `path.bad-<timestamp>`, with a counter when that name is taken. Returns the new path; OSError when
    it cannot be renamed."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(100):
        target = f"{path}{MARK}{stamp}" + (f"-{n}" if n else "")
        if not os.path.lexists(target):
            os.rename(path, target)
            return target
    raise OSError(f"no free name beside {shown(path)} to set it aside")


def shown(path: str) -> str:
    """A file name fit for a one-line notice: the base name, with bytes that are not UTF-8 escaped."""
    name = os.path.basename(path)
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_utf8(name: str) -> bool:
    """os.listdir gives undecodable bytes as lone surrogates; such a name cannot be ours."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
