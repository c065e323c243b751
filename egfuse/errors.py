"""The one exception users see: it names the file, the node and what is wrong."""

from __future__ import annotations


class EgfuseError(Exception):
    """Bad input or an impossible request, explained in one line."""

    def __init__(self, message: str, *, path: str | None = None, node: str | None = None) -> None:
        where = ", ".join(p for p in (path and f"file {path}", node and f"node {node!r}") if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.path = path
        self.node = node
