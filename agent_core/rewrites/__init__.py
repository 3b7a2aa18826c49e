"""Semantics-preserving rewrites, each checked numerically before it is kept."""
from .edits import Rewrite, RewriteResult, clone_program, remove_dead, replace_uses  # noqa: F401
from .engine import Checker, close, materialize_parameters, rewrite_program  # noqa: F401
from .rules import DEFAULT_RULES  # noqa: F401
