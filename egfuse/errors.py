"""The one exception users see: it names the file, the node and what is wrong."""

from __future__ import annotations


class EgfuseError(Exception):
    """Bad input or an impossible request, explained in one line."""

    def __init__(self, message: str, *, path: str | None = None, node: str | None = None) -> None:
        where = ", ".join(p for p in (path and f"file {path}", node and f"node {node!r}") if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.node = node


class UnsafeOutputError(EgfuseError):
    """An output that would overwrite an input, another output or something that is not a plain file."""


class ExternalDataError(EgfuseError):
    """Weights stored outside the model that cannot be trusted: outside its folder, missing or the wrong size."""


class InvalidModelError(EgfuseError):
    """A model that is not a well-formed graph: a value read but never defined, a cycle, an output nothing
    produces, a name defined twice, a tensor whose data does not match its shape, an unset IR version."""


class UnknownTargetError(EgfuseError, ValueError):
    """A target name no registered target has (a ``ValueError`` too, as it was before it was an egfuse error)."""


class UsageError(EgfuseError):
    """Flags that do not go together (``--jobs`` for one model, ``--report`` for a folder): exit 2, as argparse."""


class FeedsError(EgfuseError):
    """Inputs given for validation that do not match the model's inputs by name."""
