"""Dark and light themes: one QSS template (resources/theme/studio.qss) filled from a colour table,
a matching QPalette for what QSS does not reach, and SVG icons tinted to the theme."""
from __future__ import annotations

import json
import os

from PySide6.QtCore import QByteArray, QRectF, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

THEME_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resources", "theme")
THEMES = ("dark", "light")


def colors(name: str) -> dict[str, str]:
    with open(os.path.join(THEME_DIR, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


def stylesheet(name: str) -> str:
    with open(os.path.join(THEME_DIR, "studio.qss"), encoding="utf-8") as f:
        qss = f.read()
    for key, value in colors(name).items():
        qss = qss.replace(f"@{key}@", value)
    return qss


def apply(app: QApplication, name: str) -> None:
    if name not in THEMES:
        raise ValueError(f"unknown theme '{name}' (choose {' or '.join(THEMES)})")
    c = colors(name)
    app.setStyle("Fusion")  # the same widget metrics on every platform; QSS then sets the colours
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
    """resources/theme/icons/<name>.svg drawn in the theme's icon colour."""
    path = os.path.join(THEME_DIR, "icons", f"{name}.svg")
    with open(path, encoding="utf-8") as f:
        svg = f.read().replace("@COLOR@", colors(theme)["icon"])
    renderer = QSvgRenderer(QByteArray(svg.encode()))
    result = QIcon()
    for size in (16, 24, 32, 48):
        pm = QPixmap(size, size)
        pm.fill(Qt.transparent)
        p = QPainter(pm)
        renderer.render(p, QRectF(0, 0, size, size))
        p.end()
        result.addPixmap(pm)
    return result
