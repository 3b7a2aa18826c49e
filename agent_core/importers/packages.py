"""Saying which package a model needs when this machine lacks it.

A KernelBench file (Mamba2 imports einops) or a user's model can import a package that is not
installed here; Python's "No module named 'einops'" surfaces as a failed run of the file, which does
not say that the fix is an install on this machine. missing_package() turns it into
"model.py imports einops, which is not installed on this machine (pip install einops)".
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

# import name -> the distribution pip installs it from, where the two differ
PIP_NAMES = {"cv2": "opencv-python", "PIL": "pillow", "sklearn": "scikit-learn", "yaml": "pyyaml",
             "skimage": "scikit-image", "bs4": "beautifulsoup4", "attr": "attrs"}


def missing_package(exc: BaseException, who: str, beside: Path | None = None) -> str | None:
    """The one-line message when exc (or what caused it) is a ModuleNotFoundError for a top-level
    package that is not installed; None otherwise: a missing submodule of an installed package keeps
    Python's own message, and so does a module that is a file or folder in `beside` (the model's
    folder: the importer runs a file without its folder on sys.path, so nothing is to be installed)."""
    while exc is not None and not isinstance(exc, ModuleNotFoundError):
        exc = exc.__cause__ or exc.__context__
    if exc is None or not exc.name:
        return None
    top = exc.name.split(".")[0]
    try:
        if importlib.util.find_spec(top) is not None:
            return None
    except (ImportError, ValueError):
        pass
    if beside is not None and ((beside / f"{top}.py").exists() or (beside / top).is_dir()):
        return None
    return f"{who} imports {top}, which is not installed on this machine (pip install {PIP_NAMES.get(top, top)})"
