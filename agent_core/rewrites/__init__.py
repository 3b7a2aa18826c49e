"""Semantics-preserving rewrites, each checked numerically before it is kept."""
from .engine import (  # noqa: F401
    Checker, Rewrite, RewriteResult, clone_program, close, materialize_parameters, remove_dead,
    replace_uses, rewrite_program,
)
from .rules import DEFAULT_RULES  # noqa: F401
