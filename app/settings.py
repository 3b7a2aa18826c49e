"""The studio's settings (QSettings "StitchCUDA"/"Studio": theme, geometry, windowState, recent, the kernel
writer's endpoint under writer/), read so that nothing in them can stop the studio from starting.

The file is checked before Qt parses it: one that is not a plain file, is larger than any the studio
writes, or holds an @Variant value is set aside (renamed NAME.bad-<timestamp>). The studio never writes
an @Variant; PySide would unpickle one when its value is read, which runs code. Then each value is
checked for its type; a wrong one is removed (the default applies). Every such repair returns a
one-line notice naming the key or file, for the window to show.
"""
from __future__ import annotations

import os
import re
import stat

from PySide6.QtCore import QByteArray, QSettings

from .quarantine import set_aside, shown

ORG, APP = "StitchCUDA", "Studio"
THEMES = ("dark", "light")
MAX_FILE_BYTES = 1 << 20        # geometry, state and eight paths are a few KiB
MAX_PATH_CHARS = 4096
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]+|[0-7]+|.)", re.S)


def path() -> str:
    """Where QSettings keeps the file, without letting it parse the file: a QSettings for another,
    unused application name resolves the same folder (Qt fixes that folder at its first use)."""
    probe = QSettings(ORG, APP + "-path-probe")
    return os.path.join(os.path.dirname(probe.fileName()), APP + ".conf")


def check_file() -> list[str]:
    """Set the settings file aside if Qt should not read it; the notices say why."""
    p = path()
    try:
        st = os.stat(p)   # a link to a plain file is fine: dotfile managers link config files
    except FileNotFoundError:
        return []
    except OSError as e:
        why = f"it cannot be read ({e.strerror or e})"
    else:
        if not stat.S_ISREG(st.st_mode):
            why = "it is not a regular file"
        elif st.st_size > MAX_FILE_BYTES:
            why = f"it is {st.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} it may have"
        else:
            why = _unsafe_content(p)
    if why is None:
        return []
    try:
        moved = set_aside(p)
    except OSError as e:
        return [f"Settings file {p} is damaged ({why}) and could not be set aside ({e.strerror or e}); "
                "fix or remove it"]
    return [f"Settings file {shown(p)} was set aside as {shown(moved)}: {why}; the studio starts with defaults"]


def _unsafe_content(p: str) -> str | None:
    try:
        with open(p, "rb") as f:
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8", "replace")
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if len(text) > MAX_FILE_BYTES:
        return "it grew past the size it may have"
    # Qt un-escapes \xHH, octal and \c before it looks for "@Variant(": do the same, then look
    plain = _ESCAPE.sub(lambda m: _unescape(m.group(1)), text.replace("\\\r\n", "").replace("\\\n", ""))
    if "@Variant(" in plain or "@Variant(" in text:
        return "it holds a serialized object (an @Variant value), which the studio never writes"
    return None


def _unescape(seq: str) -> str:
    if seq[0] == "x":
        return chr(int(seq[1:], 16) & 0xFFFF)
    if seq[0].isdigit():
        return chr(int(seq, 8) & 0xFFFF)
    return seq


def theme(settings: QSettings) -> tuple[str, str | None]:
    """The theme last chosen, or dark; a value that is not a theme's name is removed."""
    value = settings.value("theme")
    if value is None or (isinstance(value, str) and value in THEMES):
        return value or "dark", None
    settings.remove("theme")
    return "dark", f"Setting 'theme' was {_short(value)}, not dark or light; reset to dark"


def byte_array(settings: QSettings, key: str, what: str) -> tuple[QByteArray | None, str | None]:
    """A saved window geometry or dock state: it must be bytes (Qt checks their content when
    restoring; `reject(key, what)` is for when it refuses them)."""
    value = settings.value(key)
    if value is None or isinstance(value, QByteArray):
        return value, None
    return None, reject(settings, key, what, f"was {_short(value)}, not saved {what}")


def reject(settings: QSettings, key: str, what: str, why: str = "could not be restored") -> str:
    settings.remove(key)
    return f"Setting '{key}' {why}; the default {what} is used"


def recent(settings: QSettings, limit: int) -> tuple[list[str], str | None]:
    """File ▸ Open Recent: absolute paths of existing files, at most `limit`. Entries that are not
    paths or no longer exist are dropped and the cleaned list saved back."""
    value = settings.value("recent")
    if value is None:   # never set, or an empty list (INI writes it as @Invalid())
        return [], None
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if items is None:
        settings.remove("recent")
        return [], f"Setting 'recent' was {_short(value)}, not a list of files; File ▸ Open Recent was cleared"
    good = [p for p in items if isinstance(p, str) and p and len(p) <= MAX_PATH_CHARS and "\x00" not in p
            and os.path.isabs(p) and os.path.isfile(p)]
    good = list(dict.fromkeys(good))[:limit]
    if len(good) == len(items):
        return good, None
    settings.setValue("recent", good)
    gone = len(items) - len(good)
    return good, (f"Setting 'recent': {gone} of its {len(items)} entries were not existing files "
                  f"and were removed from File ▸ Open Recent")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def text(settings: QSettings, key: str, default: str = "", max_chars: int = MAX_PATH_CHARS) -> tuple[str, str | None]:
    """A stored string (an endpoint URL, a model name): one line of at most max_chars; anything else
    is removed and the default applies."""
    value = settings.value(key)
    if value is None:
        return default, None
    if isinstance(value, str) and len(value) <= max_chars and not any(c in value for c in "\x00\r\n"):
        return value, None
    settings.remove(key)
    return default, f"Setting '{key}' was {_short(value)}, not one line of text; reset to {default!r}"


def integer(settings: QSettings, key: str, default: int, lo: int, hi: int) -> tuple[int, str | None]:
    """A stored whole number in [lo, hi] (INI files give it back as a string); else the default."""
    value = settings.value(key)
    if value is None:
        return default, None
    try:
        n = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is not None and lo <= n <= hi:
        return n, None
    settings.remove(key)
    return default, f"Setting '{key}' was {_short(value)}, not a whole number from {lo} to {hi}; reset to {default}"
