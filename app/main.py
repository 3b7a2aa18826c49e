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
    if theme is not None and theme not in ("dark", "light"):
        print(f"stitchcuda studio: unknown theme '{theme}' (choose dark or light)", file=sys.stderr)
        return 2
    app = application()
    win = open_studio(theme, ask=_answer_for_screenshot if screenshot else None, restore=not screenshot)
    if screenshot:
        for line in win.notices:
            print(f"stitchcuda studio: {line}", file=sys.stderr)
        win.resize(1600, 1000)
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


def application():
    """The QApplication, named so that QSettings and the recovery folder resolve to the studio's."""
    from PySide6.QtCore import QCoreApplication
    from PySide6.QtWidgets import QApplication

    QCoreApplication.setOrganizationName("StitchCUDA")
    QCoreApplication.setApplicationName("Studio")
    return QApplication.instance() or QApplication(sys.argv[:1])


def open_studio(theme: str | None = None, ask=None, restore: bool = True):
    """Everything a start does before the event loop runs, and the shown window.

    Each file read here (settings, theme files and, with `restore`, the window's saved layout, the
    recent files and the recovery folder) is checked first; a damaged one is set aside or reset and
    the window shows a one-line notice for it (win.notices): nothing read at start can stop it.
    `ask` answers the window's questions instead of dialogs (screenshot runs, tests).
    """
    from PySide6.QtCore import QSettings

    from . import settings, theme as themes
    from .main_window import MainWindow

    notices = settings.check_file()   # before any QSettings parses the file
    if theme is None:
        theme, note = settings.theme(QSettings(settings.ORG, settings.APP))
        notices += [note] if note else []
    win = MainWindow(theme=theme, restore_settings=restore)
    if ask is not None:
        win.ask = ask
    for line in notices + themes.take_notices():
        win.notice(line)
    win.show()
    if restore:
        win.offer_recovery()
    return win


def _answer_for_screenshot(kind: str, title: str, text: str) -> str:
    """No dialogs in a screenshot run: errors go to stderr, questions get the harmless answer."""
    if kind == "error":
        print(f"stitchcuda studio: {title}: {' '.join(text.split())}", file=sys.stderr)
    return "discard" if kind == "unsaved" else "no"
