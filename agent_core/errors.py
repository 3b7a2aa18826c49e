"""Errors the agent core raises. Each carries a one-line message meant for the user."""


class StitchError(Exception):
    """Base class: every error a user may see. `str(err)` is a complete one-line cause."""


class ProgramError(StitchError):
    """The program is malformed: unknown op, wrong arity, bad attribute, dangling input, ..."""

    def __init__(self, message: str, node_id: str | None = None, value_id: str | None = None):
        super().__init__(message)
        self.node_id = node_id
        self.value_id = value_id


class ShapeError(ProgramError):
    """Shape or dtype inference failed for a node."""


class CycleError(ProgramError):
    """A connection or region would create a cycle."""


class ConnectionRefused(ProgramError):
    """An edit that connects two ports was refused; the message says why."""


class FileFormatError(StitchError):
    """A project file is malformed, truncated, of the wrong type or hostile."""


class ImportFailure(StitchError):
    """A PyTorch module or KernelBench file could not be turned into a program."""
