"""Dark and light themes: one QSS template (resources/theme/studio.qss) filled from a colour table,
a matching QPalette for what QSS does not reach, and SVG icons tinted to the theme.

The files are read at every start, so a damaged one (missing, not UTF-8, huge, a colour table that is
not an object of colours) never stops the studio: the built-in colours, Qt's own look or a blank icon
stand in, and `take_notices()` gives one line per file for the window to show. They are the studio's
own files (possibly in a read-only install), so they are left where they are, not set aside."""
from __future__ import annotations

import json
import os
import re

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

THEME_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources", "theme")
THEMES = ("dark", "light")
MAX_BYTES = 1 << 20
# what a colour may be: it is pasted into the QSS, so nothing that could end a rule
_COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}|rgba?\([0-9.,% ]+\)")
BUILT_IN = {
    "dark": {"window": "#1b1e24", "panel": "#22262d", "field": "#2a2f37", "border": "#363c46", "hover": "#30363f",
             "pressed": "#3a414c", "text": "#e2e6ed", "muted": "#939cab", "accent": "#3d8fe0",
             "on_accent": "#ffffff", "scroll": "#454c58", "error": "#ff6b68", "warning": "#e8b14a",
             "icon": "#c9d0db"},
    "light": {"window": "#eceef2", "panel": "#fafbfc", "field": "#ffffff", "border": "#cdd2da", "hover": "#e2e6ec",
              "pressed": "#d5dae2", "text": "#1f2329", "muted": "#5d6675", "accent": "#1a73e8",
              "on_accent": "#ffffff", "scroll": "#c2c8d1", "error": "#c62828", "warning": "#a86b00",
              "icon": "#3a4250"},
}
_notices: list[str] = []


def take_notices() -> list[str]:
    """The problems met since the last call (each file once)."""
    out = list(dict.fromkeys(_notices))
    _notices.clear()
    return out


def _note(text: str) -> None:
    if text not in _notices:
        _notices.append(text)


def _read(path: str, fallback: str) -> str | None:
    """The text of a theme file, or None (with a notice saying what stands in) if it is unusable."""
    name = os.path.relpath(path, os.path.dirname(THEME_DIR))
    try:
        if not os.path.isfile(path):
            raise OSError("it is missing or not a file")
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise OSError(f"it is larger than {MAX_BYTES:,} bytes")
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        why = "it is not UTF-8 text"
    except OSError as e:
        why = e.strerror or str(e)
    _note(f"Theme file {name} is unusable ({why}); {fallback}")
    return None


def colors(name: str) -> dict[str, str]:
    path = os.path.join(THEME_DIR, f"{name}.json")
    fallback = f"the built-in {name} colours are used"
    text = _read(path, fallback)
    if text is None:
        return dict(BUILT_IN[name])
    try:
        table = json.loads(text)
    except (ValueError, RecursionError):
        table = None
    bad = (["it is not a JSON object"] if not isinstance(table, dict) else
           [k for k in BUILT_IN[name] if not (isinstance(table.get(k), str) and _COLOUR.fullmatch(table[k]))])
    if bad:
        _note(f"Theme file theme/{name}.json has no valid colour for {', '.join(bad)[:200]}; {fallback}")
        return dict(BUILT_IN[name])
    return {k: table[k] for k in BUILT_IN[name]}


def stylesheet(name: str) -> str:
    qss = _read(os.path.join(THEME_DIR, "studio.qss"), "the studio uses Qt's plain look") or ""
    for key, value in colors(name).items():
        qss = qss.replace(f"@{key}@", value)
    return qss


def apply(app: QApplication, name: str) -> None:
    if name not in THEMES:
        raise ValueError(f"unknown theme '{name}' (choose {' or '.join(THEMES)})")
    c = colors(name)
    # the same widget metrics on every platform; QSS then sets the colours. Set once: replacing the
    # style re-polishes every widget in the process, for each new window and each theme toggle
    if app.style().name().lower() != "fusion":
        app.setStyle("Fusion")
    pal = QPalette()
    for role, key in ((QPalette.Window, "window"), (QPalette.Base, "field"), (QPalette.AlternateBase, "panel"),
                      (QPalette.Text, "text"), (QPalette.WindowText, "text"), (QPalette.Button, "field"),
                      (QPalette.ButtonText, "text"), (QPalette.Highlight, "accent"),
                      (QPalette.HighlightedText, "on_accent"), (QPalette.ToolTipBase, "panel"),
                      (QPalette.ToolTipText, "text"), (QPalette.PlaceholderText, "muted")):
        pal.setColor(role, QColor(c[key]))
    pal.setColor(QPalette.Disabled, QPalette.Text, QColor(c["muted"]))
    pal.setColor(QPalette.Disabled, QPalette.ButtonText, QColor(c["muted"]))
    app.setPalette(pal)
    app.setStyleSheet(stylesheet(name))


def icon(name: str, theme: str) -> QIcon:
    """resources/theme/icons/<name>.svg drawn in the theme's icon colour (a blank icon if unusable)."""
    svg = _read(os.path.join(THEME_DIR, "icons", f"{name}.svg"), "its button has no icon")
    result = QIcon()
    if svg is None:
        return result
    renderer = QSvgRenderer(QByteArray(svg.replace("@COLOR@", colors(theme)["icon"]).encode()))
    if not renderer.isValid():
        _note(f"Theme file theme/icons/{name}.svg is not an SVG image; its button has no icon")
        return result
    for size in (16, 24, 32, 48):
        pm = QPixmap(size, size)
        pm.fill(Qt.transparent)
        p = QPainter(pm)
        renderer.render(p, QRectF(0, 0, size, size))
        p.end()
        result.addPixmap(pm)
    return result
