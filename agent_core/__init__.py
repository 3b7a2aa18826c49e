"""The agent core: program model, op library, importers, analysis, planner, codegen, runtime.

Nothing under this package may import Qt or pyqtgraph: it runs on GPU servers that have neither.
"""
