"""Importers: PyTorch modules and KernelBench problems become Programs.

See docs/IMPORT.md: torch.export (non-strict, pre-dispatch aten IR) -> aten_map -> library ops, and
an `opaque` node for any aten op the library cannot express. Importing a .py file runs it.
"""
from .module import import_nn_module  # noqa: F401
from .source import import_file, import_module, load_source  # noqa: F401
from .verify import verify_import  # noqa: F401

__all__ = ["import_file", "import_module", "import_nn_module", "verify_import", "load_source"]
