"""Typed views of e-nodes: ``view(node).scale`` rather than ``node.args[4]``.

An :class:`~egfuse.egraph.session.ENode` read back from egglog holds its arguments by position. Every stage after
extraction (costs, shapes, raising, writers, the report) reads them through :func:`view`, whose field names are
the constructor's parameter names in :mod:`egfuse.egraph.lang` (or in a rule family that declares its own) —
read from egglog's own declarations, so the language stays the one place that says what each argument is, and
renaming a parameter there renames it everywhere.
"""

from __future__ import annotations

import functools
from operator import itemgetter
from typing import Any

from egfuse.egraph import egg_program
from egfuse.egraph.session import ENode

__all__ = ["fields", "value_index", "view"]


@functools.cache
def _view_types() -> dict[str, type]:
    """A tuple type per constructor whose fields read its arguments by name: what ``namedtuple`` makes, without
    the source it compiles for each type (5 ms for the language's ~100 constructors, every process)."""
    views = {}
    for name, constructor in egg_program.constructors().items():
        decl = constructor.__egg_decls__.get_callable_decl(constructor.__egg_ref__)
        names = tuple(decl.signature.arg_names)
        body: dict[str, Any] = {field: property(itemgetter(i)) for i, field in enumerate(names)}
        body.update(__slots__=(), _fields=names)
        views[name] = type("".join(part.title() for part in name.split("_")), (tuple,), body)
    return views


def fields(op: str) -> tuple[str, ...]:
    """The argument names of constructor ``op``."""
    return _view_types()[op]._fields


def view(node: ENode) -> Any:
    """``node``'s arguments by name (e-class ids for tensors, Python values for the rest)."""
    return _view_types()[node.op](node.args)


def value_index(node: ENode) -> int | None:
    """The graph value a ``value`` leaf or a ``ref`` (a region's own value) stands for; None for any other."""
    return int(node.args[0]) if node.op in ("value", "ref") else None
