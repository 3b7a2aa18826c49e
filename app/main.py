"""Entry point of the studio: `stitchcuda studio [FILE] [--screenshot OUT.png] [--theme dark|light]`
and `python -m app`."""
from __future__ import annotations

import os
import sys


def run_studio(path: str | None = None, screenshot: str | None = None, theme: str | None = "dark") -> int:
    """Open the studio on `path` (a .json program or a .py KernelBench / PyTorch file).

    With `screenshot`, the window is rendered offscreen to that PNG after the program is laid out,
    and the function returns without entering the event loop (docs, bug reports, checks).
    theme=None uses the theme last chosen in the studio (View ▸ Toggle theme).
    Returns the process exit code.
    """
    if screenshot:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QCoreApplication, QSettings
    from PySide6.QtWidgets import QApplication

    QCoreApplication.setOrganizationName("StitchCUDA")
    QCoreApplication.setApplicationName("Studio")
    app = QApplication.instance() or QApplication(sys.argv[:1])
    from .main_window import MainWindow

    if theme is None:
        theme = QSettings("StitchCUDA", "Studio").value("theme", "dark") or "dark"
    if theme not in ("dark", "light"):
        print(f"stitchcuda studio: unknown theme '{theme}' (choose dark or light)", file=sys.stderr)
        return 2
    win = MainWindow(theme=theme, restore_settings=not screenshot)
    if screenshot:
        win.ask = _answer_for_screenshot
        win.resize(1600, 1000)
    win.show()
    if not screenshot:
        win.offer_recovery()
    if path and screenshot and not win.open_path(path, layout_sync=True):
        return 1
    if path and not screenshot:
        win.open_in_background(path)  # the window is up at once; an import may take seconds
    if screenshot:
        app.processEvents()
        win.view.show_program()
        app.processEvents()
        try:
            win.screenshot(screenshot)
        except OSError as e:
            print(f"stitchcuda studio: {e}", file=sys.stderr)
            return 1
        win.document.mark_clean()  # a screenshot run never prompts or autosaves
        win.close()
        print(f"wrote {screenshot}")
        return 0
    return app.exec()


def _answer_for_screenshot(kind: str, title: str, text: str) -> str:
    """No dialogs in a screenshot run: errors go to stderr, questions get the harmless answer."""
    if kind == "error":
        print(f"stitchcuda studio: {title}: {' '.join(text.split())}", file=sys.stderr)
    return "discard" if kind == "unsaved" else "no"
