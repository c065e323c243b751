"""A dim's text evaluated once each symbol has a size: what a shape comes to at the sizes the cost model binds.

Separate from the normal form (:mod:`egfuse.analysis.dim_polys`): a call such as ``Max(0, 1 - s)`` is one opaque atom
of a polynomial, so expanding polynomials never gets rid of it — only evaluation at known sizes does.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

_CALLS: dict[str, Callable[..., int]] = {
    "Max": max, "max": max, "Min": min, "min": min, "Abs": abs, "abs": abs,
    "floor": math.floor, "ceil": math.ceil, "FloorDiv": operator.floordiv, "Mod": operator.mod,
}  # fmt: skip
_BINARY: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.floordiv,
}


def evaluate(text: str, size_of: Callable[[str], int]) -> int | None:
    """The number a dim's text comes to once each name has a size, or ``None`` where the text is no expression
    over ``+ - * // % /`` and the calls exporters write (``Max(0, 1 - s)``: torch's symbolic shapes). A call is one
    atom of a polynomial, so expanding polynomials never gets rid of it: only evaluation does."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def walk(node: ast.AST) -> int | None:
        if isinstance(node, ast.Name):
            return size_of(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = walk(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = walk(node.left), walk(node.right)
            if a is None or b is None or (b == 0 and not isinstance(node.op, ast.Add | ast.Sub | ast.Mult)):
                return None
            return _BINARY[type(node.op)](a, b)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
            args = [walk(arg) for arg in node.args]
            if not args or any(arg is None for arg in args) or node.keywords:
                return None
            return int(_CALLS[node.func.id](*args))
        return None

    return walk(tree)
